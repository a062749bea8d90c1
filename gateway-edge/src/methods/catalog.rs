//! What a client can choose from: `models.list` (the models of the agent
//! runtime the coordinator executes runs through), `commands.list` (the
//! slash commands this edge interprets), and the empty inboxes this edge
//! has nothing for (`question.list`, `plugin.approval.list`,
//! `exec.approval.list`, `taskSuggestions.list`): no runtime here asks
//! questions, requests approvals or suggests tasks, so each is truthfully
//! empty.

use std::sync::Arc;

use run_coordinator_api::model::{ModelCatalog, ModelInfo, RuntimeInfo};
use serde_json::{Value, json};

use super::{Answer, backend_error, fail};
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;

/// The runtime's models, as the coordinator describes them.
pub(super) async fn runtime_catalog(
    edge: &Arc<Edge>,
) -> Result<ModelCatalog, (ErrorShape, Option<Value>)> {
    Ok(runtime_info(edge).await?.catalog)
}

/// The runtime the coordinators execute runs through, and its models.
pub(super) async fn runtime_info(
    edge: &Arc<Edge>,
) -> Result<RuntimeInfo, (ErrorShape, Option<Value>)> {
    edge.backends
        .coordinator
        .describe_runtime()
        .await
        .map_err(backend_error)
}

/// `provider/id`, the protocol's model reference.
pub(super) fn model_ref(model: &ModelInfo) -> String {
    format!("{}/{}", model.provider, model.id)
}

/// The model a run without a choice uses: the named default, else the
/// first.
pub(super) fn default_model(catalog: &ModelCatalog) -> Option<&ModelInfo> {
    let named = catalog.default_model.as_deref();
    let by_id = catalog.models.iter().find(|m| Some(m.id.as_str()) == named);
    by_id.or(catalog.models.first())
}

/// The reference of the model a run without a choice uses.
pub(super) fn default_model_ref(catalog: &ModelCatalog) -> Option<String> {
    default_model(catalog).map(model_ref)
}

/// The model a session without a choice of its own runs with, as
/// `sessions.list` and the history pages give it in `defaults` (clients
/// show it as the session's model): `modelProvider`, `model` and
/// `contextTokens`, `null` when the runtime names no model or window.
pub(super) async fn session_defaults(
    edge: &Arc<Edge>,
) -> Result<Value, (ErrorShape, Option<Value>)> {
    let catalog = runtime_catalog(edge).await?;
    let model = default_model(&catalog);
    Ok(json!({
        "modelProvider": model.map(|m| &m.provider),
        "model": model.map(|m| &m.id),
        "contextTokens": model.and_then(|m| m.context_window),
    }))
}

pub(super) const MODELS_LIST_KEYS: &[&str] = &[
    "agentId",
    "sessionKey",
    "authProfileId",
    "provider",
    "includeDetails",
    "includeProviderCapabilities",
    "includeDefaultModels",
    "preparedOnly",
    "refresh",
    "view",
];

pub(super) async fn models_list(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    p.one_of("view", &["default", "configured", "provider-config", "all"])
        .map_err(fail)?;
    if p.boolean("preparedOnly").map_err(fail)? == Some(true)
        && p.boolean("refresh").map_err(fail)? == Some(true)
    {
        return Err(fail(
            p.error("preparedOnly and refresh cannot be used together"),
        ));
    }
    if p.value("sessionKey").is_some() && p.value("authProfileId").is_some() {
        return Err(fail(
            p.error("sessionKey and authProfileId cannot be used together"),
        ));
    }
    let provider = p.optional_non_empty("provider").map_err(fail)?;
    let catalog = runtime_catalog(edge).await?;
    let models: Vec<Value> = catalog
        .models
        .iter()
        .filter(|m| provider.is_none_or(|p| p == m.provider))
        .map(|m| {
            let mut row = json!({
                "id": m.id,
                "name": if m.name.is_empty() { &m.id } else { &m.name },
                "provider": m.provider,
                "available": true,
                "reasoning": m.reasoning,
                "input": m.input,
            });
            if let Some(window) = m.context_window {
                row["contextWindow"] = json!(window);
            }
            row
        })
        .collect();
    Ok(json!({ "models": models }))
}

/// A slash command this edge interprets in `chat.send` and `agent`.
pub(super) struct SlashCommand {
    pub name: &'static str,
    pub description: &'static str,
    pub accepts_args: bool,
}

pub(super) const SLASH_COMMANDS: &[SlashCommand] = &[
    SlashCommand {
        name: "stop",
        description: "Stop the session's active run",
        accepts_args: false,
    },
    SlashCommand {
        name: "new",
        description: "Start a new session (the transcript starts afresh)",
        accepts_args: true,
    },
    SlashCommand {
        name: "reset",
        description: "Reset the session (the transcript starts afresh)",
        accepts_args: true,
    },
    SlashCommand {
        name: "queue",
        description: "Set how the session queues messages sent while it runs (steer, followup, collect, interrupt, default)",
        accepts_args: true,
    },
];

pub(super) const COMMANDS_LIST_KEYS: &[&str] =
    &["sessionKey", "agentId", "provider", "scope", "includeArgs"];

pub(super) async fn commands_list(p: &Params<'_>) -> Answer {
    let scope = p
        .one_of("scope", &["text", "native", "both"])
        .map_err(fail)?
        .unwrap_or("both");
    p.boolean("includeArgs").map_err(fail)?;
    // Every command here is typed as text; none is a native (menu) command.
    if scope == "native" {
        return Ok(json!({ "commands": [] }));
    }
    let commands: Vec<Value> = SLASH_COMMANDS
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "textAliases": [format!("/{}", c.name)],
                "description": c.description,
                "category": "session",
                "source": "native",
                "scope": "text",
                "acceptsArgs": c.accepts_args,
            })
        })
        .collect();
    Ok(json!({ "commands": commands }))
}

pub(super) const TASK_SUGGESTIONS_KEYS: &[&str] = &["sessionKey", "agentId"];

pub(super) async fn task_suggestions_list(p: &Params<'_>) -> Answer {
    p.optional_non_empty("sessionKey").map_err(fail)?;
    p.optional_non_empty("agentId").map_err(fail)?;
    Ok(json!({ "suggestions": [] }))
}

pub(super) const CHAT_METADATA_KEYS: &[&str] = &["agentId", "authProfileId", "sessionKey"];

/// What a chat's composer offers: the models and the slash commands.
pub(super) async fn chat_metadata(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    if p.value("sessionKey").is_some() && p.value("authProfileId").is_some() {
        return Err(fail(
            p.error("sessionKey and authProfileId cannot be used together"),
        ));
    }
    composer_metadata(edge).await
}

/// `chat.metadata`'s answer, also `chat.startup`'s `metadata`.
pub(super) async fn composer_metadata(edge: &Arc<Edge>) -> Answer {
    let none = Value::Null;
    let Value::Object(mut models) =
        models_list(edge, &Params::ignored("models.list", &none)).await?
    else {
        unreachable!("models.list answers an object");
    };
    let Value::Object(commands) = commands_list(&Params::ignored("commands.list", &none)).await?
    else {
        unreachable!("commands.list answers an object");
    };
    models.extend(commands);
    models.insert("swarmEnabled".into(), json!(false));
    models.insert(
        "accountSelection".into(),
        json!({ "kind": "automatic", "label": "Automatic account selection" }),
    );
    models.insert("runtimeSelectionLocked".into(), json!(false));
    Ok(Value::Object(models))
}

//! A session's settings (`sessions.patch`, `sessions.create`): what a user
//! chose for it — its name, archive and pin state, read marker, model,
//! thinking level, queue mode, and how the UI shows it. They live in the
//! store (`Session::settings_json`, patched atomically there); this edge
//! defines their keys.
//!
//! A patch is checked against what this gateway can do: a model must be
//! one the runtime offers, a thinking level one the model has; a key that
//! would ask for something this gateway does not do (exec hosts, sandboxes,
//! permission modes, tool overrides, other runtimes) is refused unless it
//! clears it (`null`), so nothing is accepted and then silently ignored.

use std::sync::Arc;

use clawgate_common::clock::now_ms;
use serde_json::{Map, Value, json};
use session_store_api::model::{PatchSession, Session, settings_digest};
use session_store_api::{SessionKey, SessionStore};

use super::catalog::{model_ref, runtime_catalog};
use super::sessions::{AGENT_ID, session_row};
use super::{Answer, fail, key_for, store_error};
use crate::config::QueueMode;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::caches::TurnSettings;

/// Settings stored as given: how the UI shows and sorts the session.
const PRESENTATION: &[&str] = &[
    "autoLabel",
    "icon",
    "color",
    "category",
    "boardFace",
    "boardPresentation",
    "attention",
    "archived",
    "pinned",
    "verboseLevel",
    "traceLevel",
    "reasoningLevel",
    "responseUsage",
    "fastMode",
];

/// Keys that would change how runs execute in ways this gateway has no
/// part for: only `null` (nothing to clear) is accepted.
const UNSUPPORTED: &[&str] = &[
    "contextWindow",
    "toolOverrides",
    "elevatedLevel",
    "execHost",
    "execSecurity",
    "execAsk",
    "execNode",
    "permissionMode",
    "sandboxMode",
    "nativeRuntimeConsent",
    "agentRuntime",
    "completionOwnerSessionKey",
    "inheritedToolPolicyVersion",
    "inheritedToolAllow",
    "inheritedToolDeny",
    "sendPolicy",
    "groupActivation",
];

/// Expectations about state this gateway does not have (it is always
/// absent): only `null` holds.
const EXPECT_ABSENT: &[&str] = &[
    "expectedLifecycleRevision",
    "expectedPermissionMode",
    "expectedSandboxMode",
    "expectedNativeRuntimeConsent",
    "expectedToolOverrides",
];

/// `sessions.patch`'s params besides the lists above: the key, the
/// expectations it checks, and the mutations it reads itself.
const PATCH_OWN_KEYS: &[&str] = &[
    "key",
    "agentId",
    "expectedSessionId",
    "expectedMarkedUnreadAt",
    "label",
    "statusNote",
    "ttlMinutes",
    "unread",
    "thinkingLevel",
    "model",
];

const PATCH_PARTS: &[&[&str]] = &[PATCH_OWN_KEYS, EXPECT_ABSENT, PRESENTATION, UNSUPPORTED];

/// `sessions.patch`'s params: every key of the lists it is made of.
pub(super) const SESSIONS_PATCH_KEYS: &[&str] = &crate::protocol::params::concat_keys::<
    { crate::protocol::params::keys_len(PATCH_PARTS) },
>(PATCH_PARTS);

/// The settings of `session` as an object (empty when it has none).
pub(super) fn settings_of(session: &Session) -> Map<String, Value> {
    match serde_json::from_str(&session.settings_json) {
        Ok(Value::Object(settings)) => settings,
        _ => Map::new(),
    }
}

/// The queue mode a send to `session` gets when it names none.
pub(super) fn queue_mode_of(edge: &Edge, session: Option<&Session>) -> QueueMode {
    session
        .map(settings_of)
        .and_then(|s| {
            s.get("queueMode")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .and_then(|mode| <QueueMode as clap::ValueEnum>::from_str(&mode, false).ok())
        .unwrap_or(edge.config.default_queue_mode)
}

/// What a turn of `session` runs with (`None`: it has no row).
pub(super) fn turn_settings_of(edge: &Edge, session: Option<&Session>) -> TurnSettings {
    let model = session
        .map(settings_of)
        .and_then(|s| s.get("model").and_then(Value::as_str).map(str::to_owned));
    let options = match model {
        // Stored as `provider/id`; the runtime names it by its id.
        Some(model) => {
            json!({ "model": model.split_once('/').map_or(model.as_str(), |(_, id)| id) })
        }
        None => json!({}),
    };
    TurnSettings {
        options,
        queue_mode: queue_mode_of(edge, session),
        digest: session.map(|s| settings_digest(&s.settings_json)),
    }
}

/// Reads the settings of `key` from the store (and keeps them in the
/// edge's settings cache).
pub(super) async fn read_turn_settings(
    edge: &Arc<Edge>,
    key: &SessionKey,
) -> Result<TurnSettings, (ErrorShape, Option<Value>)> {
    let session = edge
        .backends
        .store
        .get_session(key)
        .await
        .map_err(store_error)?;
    let settings = turn_settings_of(edge, session.as_ref());
    edge.settings_cache.put(key, &settings);
    Ok(settings)
}

/// Checks `model` against the runtime's models: its `provider/id`.
async fn known_model(edge: &Arc<Edge>, model: &str) -> Result<String, (ErrorShape, Option<Value>)> {
    let catalog = runtime_catalog(edge).await?;
    catalog
        .models
        .iter()
        .find(|m| model_ref(m) == model || m.id == model)
        .map(model_ref)
        .ok_or_else(|| {
            fail(ErrorShape::invalid(format!(
                "unknown model: {model} (models.list shows the models this gateway runs)"
            )))
        })
}

/// The thinking levels the runtime's models take: none reason here.
const THINKING_LEVELS: &[&str] = &["off"];

/// The store patch for the mutations in `p`.
async fn patch_of(
    edge: &Arc<Edge>,
    p: &Params<'_>,
) -> Result<Map<String, Value>, (ErrorShape, Option<Value>)> {
    let mut patch = Map::new();
    for key in UNSUPPORTED {
        if p.value(key).is_some() {
            return Err(fail(ErrorShape::invalid(format!(
                "{key} is not supported by this gateway (only null, to clear it)"
            ))));
        }
    }
    for key in PRESENTATION {
        if let Some(value) = p.raw(key) {
            patch.insert((*key).to_owned(), value.clone());
        }
    }
    for key in ["archived", "pinned"] {
        p.boolean(key).map_err(fail)?;
    }
    if let Some(label) = p.raw("label") {
        if !(label.is_null()
            || label
                .as_str()
                .is_some_and(|l| !l.is_empty() && l.chars().count() <= 512))
        {
            return Err(fail(
                p.error("/label must be a string of 1 to 512 characters, or null"),
            ));
        }
        patch.insert("label".into(), label.clone());
    }
    if let Some(note) = p.raw("statusNote") {
        if !(note.is_null() || note.as_str().is_some_and(|n| n.chars().count() <= 120)) {
            return Err(fail(p.error(
                "/statusNote must be a string of at most 120 characters, or null",
            )));
        }
        let ttl = p.integer("ttlMinutes", 1, 120).map_err(fail)?;
        patch.insert("statusNote".into(), note.clone());
        patch.insert(
            "statusNoteExpiresAt".into(),
            match (note.is_null(), ttl) {
                (false, Some(minutes)) => json!(now_ms() + minutes as i64 * 60_000),
                _ => Value::Null,
            },
        );
    }
    if let Some(unread) = p.boolean("unread").map_err(fail)? {
        if unread {
            patch.insert("markedUnreadAt".into(), json!(now_ms()));
        } else {
            patch.insert("markedUnreadAt".into(), Value::Null);
            patch.insert("lastReadAt".into(), json!(now_ms()));
        }
    }
    match p.raw("model") {
        Some(Value::Null) => {
            patch.insert("model".into(), Value::Null);
        }
        Some(Value::String(model)) => {
            patch.insert("model".into(), json!(known_model(edge, model).await?));
        }
        Some(_) => return Err(fail(p.error("/model must be string or null"))),
        None => {}
    }
    match p.raw("thinkingLevel") {
        Some(Value::String(level)) if !THINKING_LEVELS.contains(&level.as_str()) => {
            return Err(fail(ErrorShape::invalid(format!(
                "unsupported thinking level: {level} (the models here take: {})",
                THINKING_LEVELS.join(", ")
            ))));
        }
        Some(level) => {
            patch.insert("thinkingLevel".into(), level.clone());
        }
        None => {}
    }
    Ok(patch)
}

/// The expectations in `p` against the session as it is now.
fn check_expectations(
    p: &Params<'_>,
    current: Option<&Session>,
) -> Result<(), (ErrorShape, Option<Value>)> {
    use super::sessions::{check_session_id, session_changed as changed};
    check_session_id(
        current,
        p.optional_non_empty("expectedSessionId").map_err(fail)?,
    )?;
    for key in EXPECT_ABSENT {
        if p.value(key).is_some() {
            return Err(changed(key));
        }
    }
    if let Some(expected) = p.raw("expectedMarkedUnreadAt") {
        let now = current
            .map(settings_of)
            .and_then(|s| s.get("markedUnreadAt").cloned())
            .unwrap_or(Value::Null);
        if &now != expected {
            return Err(changed("expectedMarkedUnreadAt"));
        }
    }
    Ok(())
}

pub(super) async fn sessions_patch(call: &super::Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    let key = key_for("sessions.patch", p.required_non_empty("key").map_err(fail)?)?;
    super::sessions::check_agent(p)?;
    let patch = patch_of(edge, p).await?;
    let session = apply_patch(call, &key, p, patch).await?;
    Ok(json!({
        "ok": true, "path": "session-store", "key": key.as_str(),
        "entry": session_row(&session, &[]), "resolved": resolved(edge, &session).await?,
    }))
}

/// `sessions.patchMany`'s params, and what each of its targets may hold.
pub(super) const SESSIONS_PATCH_MANY_KEYS: &[&str] = &["targets", "patch"];
const PATCH_MANY_TARGET_KEYS: &[&str] = &[
    "key",
    "agentId",
    "expectedSessionId",
    "expectedLifecycleRevision",
    "expectedSandboxMode",
    "expectedPermissionMode",
    "expectedNativeRuntimeConsent",
    "expectedToolOverrides",
    "expectedMarkedUnreadAt",
];
/// OpenClaw's bound on the targets of one `sessions.patchMany`.
const MAX_PATCH_TARGETS: usize = 100;

/// One patch to many sessions: the patch is checked once, then applied to
/// each target in order, each with its own expectations; one that fails
/// says why in its outcome and the others go on.
pub(super) async fn sessions_patch_many(call: &super::Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    let targets = match p.raw("targets") {
        Some(Value::Array(targets)) if (1..=MAX_PATCH_TARGETS).contains(&targets.len()) => targets,
        Some(Value::Array(_)) => {
            return Err(fail(p.error(&format!(
                "/targets must have 1 to {MAX_PATCH_TARGETS} items"
            ))));
        }
        _ => {
            return Err(fail(
                p.error("must have required property 'targets' (an array)"),
            ));
        }
    };
    let mutation_keys: Vec<&str> = SESSIONS_PATCH_KEYS
        .iter()
        .copied()
        .filter(|k| !PATCH_MANY_TARGET_KEYS.contains(k))
        .collect();
    let raw_patch = match p.raw("patch") {
        Some(Value::Object(patch)) if !patch.is_empty() => p.raw("patch").expect("just matched"),
        _ => {
            return Err(fail(
                p.error("/patch must be an object with 1 property at least"),
            ));
        }
    };
    let patch_params =
        Params::nested("sessions.patchMany", "/patch", raw_patch, &mutation_keys).map_err(fail)?;
    let patch = patch_of(edge, &patch_params).await?;
    let mut checked = Vec::with_capacity(targets.len());
    for (n, target) in targets.iter().enumerate() {
        let path = format!("/targets/{n}");
        let target = Params::nested("sessions.patchMany", path, target, PATCH_MANY_TARGET_KEYS)
            .map_err(fail)?;
        let key = key_for(
            "sessions.patchMany",
            target.required_non_empty("key").map_err(fail)?,
        )?;
        super::sessions::check_agent(&target)?;
        checked.push((key, target));
    }
    let mut outcomes = Vec::with_capacity(checked.len());
    for (key, target) in &checked {
        outcomes.push(match apply_patch(call, key, target, patch.clone()).await {
            Ok(_) => json!({ "ok": true, "key": key.as_str() }),
            Err((error, _)) => {
                json!({ "ok": false, "key": key.as_str(), "error": error.to_value() })
            }
        });
    }
    Ok(json!({ "outcomes": outcomes }))
}

/// Patches `key` with `patch` if the session is still as `expectations`
/// say, and tells the session's watchers after the reply.
async fn apply_patch(
    call: &super::Call<'_>,
    key: &SessionKey,
    expectations: &Params<'_>,
    patch: Map<String, Value>,
) -> Result<Session, (ErrorShape, Option<Value>)> {
    let store = &call.edge.backends.store;
    let current = store.get_session(key).await.map_err(store_error)?;
    check_expectations(expectations, current.as_ref())?;
    let out = store
        .patch_session(PatchSession {
            key: key.clone(),
            patch_json: Value::Object(patch).to_string(),
            create: true,
        })
        .await
        .map_err(store_error)?;
    super::sessions::changed_after_reply(
        call,
        key,
        Some(out.session.session_id.to_string()),
        "patch",
    );
    Ok(out.session)
}

/// The model a session's runs use: `{modelProvider, model}`.
async fn resolved(
    edge: &Arc<Edge>,
    session: &Session,
) -> Result<Value, (ErrorShape, Option<Value>)> {
    let chosen = settings_of(session)
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let reference = match chosen {
        Some(model) => Some(model),
        None => super::catalog::default_model_ref(&runtime_catalog(edge).await?),
    };
    Ok(match reference.as_deref().and_then(|r| r.split_once('/')) {
        Some((provider, model)) => json!({ "modelProvider": provider, "model": model }),
        None => json!({}),
    })
}

/// The keys of `sessions.create` that would need what this gateway does
/// not have (workspaces, repositories, worktrees, exec nodes, forks, other
/// runtimes), and after them any `$more`.
macro_rules! create_unsupported {
    ($($more:literal),*) => {
        &[
            "agentRuntime", "contextWindow", "permissionMode", "toolOverrides", "visibility",
            "catalogId", "fork", "forkFrom", "projectId", "projectGitUrl", "repository",
            "worktree", "worktreeSource", "worktreeBaseRef", "worktreeName", "execNode", "cwd",
            "spawnDepth", $($more),*
        ]
    };
}

/// Refused when set.
const CREATE_UNSUPPORTED: &[&str] = create_unsupported!();

pub(super) const SESSIONS_CREATE_KEYS: &[&str] = create_unsupported!(
    "key",
    "idempotencyKey",
    "agentId",
    "label",
    "displayName",
    "titleSource",
    "category",
    "model",
    "thinkingLevel",
    "fastMode",
    "incognito",
    "parentSessionKey",
    "emitCommandHooks",
    "succeedsParent",
    "timeoutMs",
    "task",
    "message",
    "mentions",
    "attachments"
);

/// `sessions.create`: a session under `key` (a new key when none is
/// given; an existing session is adopted, its settings kept), and, with a
/// `message` or `task`, its first turn.
pub(super) async fn sessions_create(call: &super::Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    super::sessions::check_agent(p)?;
    for key in CREATE_UNSUPPORTED {
        if p.value(key).is_some_and(|v| v != &Value::Bool(false)) {
            return Err(fail(ErrorShape::invalid(format!(
                "sessions.create {key} is not supported by this gateway"
            ))));
        }
    }
    if p.boolean("incognito").map_err(fail)? == Some(true) {
        return Err(fail(ErrorShape::invalid(
            "incognito sessions are not supported by this gateway",
        )));
    }
    let raw_key = match p.optional_non_empty("key").map_err(fail)? {
        Some(raw) => raw.to_owned(),
        None => format!("agent:{AGENT_ID}:dashboard:{}", uuid::Uuid::new_v4()),
    };
    let key = key_for("sessions.create", &raw_key)?;
    let mut patch = patch_of(edge, p).await?;
    for key in ["displayName", "titleSource"] {
        if let Some(value) = p.string(key).map_err(fail)? {
            patch.insert(key.to_owned(), json!(value));
        }
    }
    if let Some(parent) = p.optional_non_empty("parentSessionKey").map_err(fail)? {
        let parent = key_for("sessions.create", parent)?;
        patch.insert("parentSessionKey".into(), json!(parent.as_str()));
    }
    for flag in ["emitCommandHooks", "succeedsParent"] {
        p.boolean(flag).map_err(fail)?;
    }
    let store = &edge.backends.store;
    let existing = store.get_session(&key).await.map_err(store_error)?;
    // Adopting an existing session keeps its settings.
    let patch = if existing.is_some() {
        Map::new()
    } else {
        patch
    };
    let out = store
        .patch_session(PatchSession {
            key: key.clone(),
            patch_json: Value::Object(patch).to_string(),
            create: true,
        })
        .await
        .map_err(store_error)?;
    let session_id = out.session.session_id.to_string();
    if out.created {
        super::sessions::changed_after_reply(call, &key, Some(session_id.clone()), "create");
    }
    let mut answer = json!({
        "ok": true, "key": key.as_str(), "sessionId": session_id,
        "entry": session_row(&out.session, &[]), "runStarted": false,
        "resolved": resolved(edge, &out.session).await?,
    });
    let first = p
        .string("message")
        .map_err(fail)?
        .or(p.string("task").map_err(fail)?);
    if let Some(message) = first.filter(|m| !m.trim().is_empty()) {
        let run_id = p
            .optional_non_empty("idempotencyKey")
            .map_err(fail)?
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
        let timeout_ms = p
            .integer("timeoutMs", 0, 48 * 3600 * 1000)
            .map_err(fail)?
            .unwrap_or(0);
        let turn = super::chat::Turn {
            session: &key,
            run_id: &run_id,
            message,
            queue_mode: None,
            timeout_ms,
            attachments: super::attachments::parse(edge, p)?,
        };
        let started = super::chat::start_turn(call, turn).await?;
        answer["runStarted"] = json!(true);
        answer["runId"] = started["runId"].clone();
        answer["status"] = started["status"].clone();
    }
    Ok(answer)
}

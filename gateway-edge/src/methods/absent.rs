//! The reads of features this gateway does not have, answered truthfully:
//! nothing. It has no messaging channels and so no channel pairing, no
//! paired devices or nodes, no worktrees, no plugins and no plugin catalogue, no skills catalogue,
//! no meeting transcripts, no approval history (it asks for no approvals),
//! no cron jobs, so no cron runs, no skills and no memory search, no exec
//! tool and no theme catalogue. Each answer has the shape OpenClaw's
//! protocol gives the method (its result schema in openclaw 2026.9.6), so
//! that the Control UI's pages show their empty state instead of an error.
//! The writes of these features stay unserved (`unknown method`).

use clawgate_common::clock::now_ms;
use serde_json::{Value, json};

use super::{Answer, Call, fail};

/// `channels.status`'s params.
pub(super) const CHANNELS_STATUS_KEYS: &[&str] = &["probe", "timeoutMs", "channel"];
/// `channels.pairing.list`'s params.
pub(super) const CHANNELS_PAIRING_LIST_KEYS: &[&str] = &["channel", "accountId"];
/// `approval.history`'s params.
pub(super) const APPROVAL_HISTORY_KEYS: &[&str] = &["cursor", "limit", "kind"];
/// `transcripts.list`'s params.
pub(super) const TRANSCRIPTS_LIST_KEYS: &[&str] = &[
    "limit",
    "cursor",
    "query",
    "providerId",
    "accountId",
    "agentId",
    "startedAfter",
    "startedBefore",
];
/// `plugins.catalog.browse`'s params.
pub(super) const PLUGINS_CATALOG_BROWSE_KEYS: &[&str] = &[
    "query",
    "searchSource",
    "intent",
    "category",
    "cursor",
    "pageSize",
];
/// `skills.search`'s params.
pub(super) const SKILLS_SEARCH_KEYS: &[&str] = &["query", "limit"];
/// `cron.runs`'s params.
pub(super) const CRON_RUNS_KEYS: &[&str] = &[
    "agentId",
    "scope",
    "id",
    "jobId",
    "runId",
    "limit",
    "offset",
    "statuses",
    "status",
    "deliveryStatuses",
    "deliveryStatus",
    "query",
    "sortDir",
];

/// `skills.status`'s params.
pub(super) const SKILLS_STATUS_KEYS: &[&str] = &["agentId", "sessionKey"];
/// `skills.library.list`'s params.
pub(super) const SKILLS_LIBRARY_LIST_KEYS: &[&str] = &["sessionKey", "scope"];
/// `doctor.memory.status`'s params.
pub(super) const DOCTOR_MEMORY_STATUS_KEYS: &[&str] = &["agentId", "probe"];

/// The one agent this gateway runs.
const AGENT_ID: &str = "main";

/// No channel is configured: every map is empty.
pub(super) async fn channels_status() -> Answer {
    Ok(json!({
        "ts": now_ms(), "channelOrder": [], "channelLabels": {}, "channels": {},
        "channelAccounts": {}, "channelDefaultAccountId": {},
    }))
}

/// No pairing: no accounts, no requests, and no room for any.
pub(super) async fn channels_pairing_list() -> Answer {
    Ok(json!({
        "accounts": [], "requests": [], "commandOwnerConfigured": false,
        "limits": { "pendingPerAccount": 0, "ttlMs": 0 },
    }))
}

/// No node is connected (nodes would connect with role `node`, which this
/// edge refuses).
pub(super) async fn node_list() -> Answer {
    Ok(json!({ "ts": now_ms(), "nodes": [] }))
}

/// A page of nothing, in the paging shape of `cron.list` and `cron.runs`:
/// the items under `items_key`, the limit asked (50 by default, as
/// OpenClaw's) and the offset bounded by the total, as OpenClaw bounds it.
pub(super) async fn empty_page(call: &Call<'_>, items_key: &str) -> Answer {
    let limit = call
        .params
        .raw("limit")
        .and_then(Value::as_u64)
        .unwrap_or(50);
    let mut page = json!({
        "total": 0, "offset": 0, "limit": limit, "hasMore": false, "nextOffset": null,
    });
    page[items_key] = json!([]);
    Ok(page)
}

/// The agent's skills: none.
pub(super) async fn skills_status() -> Answer {
    Ok(json!({ "agentId": AGENT_ID, "skills": [] }))
}

/// The skill library: empty, and no one can publish to it (no profiles,
/// nothing to manage); a session's selections are empty too.
pub(super) async fn skills_library_list(call: &Call<'_>) -> Answer {
    let mut library = json!({
        "entries": [], "profileId": null, "multipleProfiles": false,
        "defaultTarget": "unavailable", "canManageWorkspace": false, "defaultSelectionLimit": 64,
    });
    if let Some(raw) = call.params.raw("sessionKey").and_then(Value::as_str) {
        let key = super::key_for(&call.request.method, raw)?;
        library["session"] =
            json!({ "sessionKey": key.as_str(), "selections": [], "attachable": [] });
    }
    Ok(library)
}

/// No memory search runs here, which OpenClaw reports as this answer.
pub(super) async fn doctor_memory_status() -> Answer {
    Ok(json!({
        "agentId": AGENT_ID, "searchRuntimeRegistered": false,
        "embedding": { "ok": false, "error": "memory search unavailable" },
    }))
}

/// `tools.github.status`'s params.
pub(super) const TOOLS_GITHUB_STATUS_KEYS: &[&str] = &["agentId", "selectedScope"];
/// `webSearch.status`'s params.
pub(super) const WEB_SEARCH_STATUS_KEYS: &[&str] = &["agentId", "modelProvider", "modelId"];

/// No GitHub identity is configured and none is detected: the agents of
/// this gateway run no GitHub tools. The system scope's identity is the
/// effective one; no agent has an override.
pub(super) async fn tools_github_status(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let agent_id = params.required_non_empty("agentId").map_err(fail)?;
    params.required_string("selectedScope").map_err(fail)?;
    let scope = params
        .one_of("selectedScope", &["system", "agent"])
        .map_err(fail)?
        .unwrap_or("system");
    let effective = json!({
        "source": "system-detected", "credentialKind": "native", "credentialState": "unavailable",
        "account": null, "gitAuthor": { "name": null, "email": null }, "evidence": "none",
        "accessExpiresAtMs": null, "refreshState": "not_applicable", "oauthScopes": [],
        "repositoryGrants": "unknown",
    });
    let selected = if scope == "system" {
        effective.clone()
    } else {
        Value::Null
    };
    Ok(json!({
        "agentId": agent_id, "selectedScope": scope,
        "selected": { "scope": scope, "configured": false, "identity": selected },
        "effective": effective,
    }))
}

/// No web search tool runs here: disabled, no providers, for the model
/// asked about (the runtime's default when none is named).
pub(super) async fn web_search_status(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let agent_id = params
        .optional_non_empty("agentId")
        .map_err(fail)?
        .unwrap_or(AGENT_ID);
    let runtime = super::catalog::runtime_info(call.edge).await?;
    let named = (
        params.optional_non_empty("modelProvider").map_err(fail)?,
        params.optional_non_empty("modelId").map_err(fail)?,
    );
    let (provider, id) = match (named, super::catalog::default_model(&runtime.catalog)) {
        ((Some(provider), Some(id)), _) => (provider.to_owned(), id.to_owned()),
        (_, Some(model)) => (model.provider.clone(), model.id.clone()),
        // A runtime that lists no models runs its own.
        (_, None) => (runtime.name.clone(), runtime.name.clone()),
    };
    Ok(json!({
        "enabled": false, "provider": null, "agentId": agent_id,
        "model": { "provider": provider, "id": id, "runtime": runtime.name },
        "route": {
            "kind": "unavailable", "label": "Web search",
            "reason": "This gateway runs no web search tool.", "testable": false,
        },
        "providers": [],
    }))
}

/// No shell command runs here (the runtimes have no exec tool), so the
/// exec policy is the closed one, and there is no approvals file: nothing
/// to edit (`exec.approvals.set` stays unserved).
pub(super) async fn exec_approvals_get() -> Answer {
    Ok(json!({
        "path": "clawgate", "exists": false, "hash": "none", "file": { "version": 1 },
        "resolvedDefaults": {
            "security": "deny", "ask": "off", "askFallback": "deny", "autoAllowSkills": false,
        },
    }))
}

/// The default theme of the Control UI, the one theme this gateway lists:
/// it keeps no theme choices (`themes.set` stays unserved), so the UI
/// shows the theme it ships with, in the mode the browser asks for.
pub(super) async fn themes_list() -> Answer {
    let claw = json!({
        "id": "claw", "name": "Claw", "description": "The Control UI's default theme.",
        "source": "builtin", "modes": ["light", "dark"],
    });
    Ok(json!({
        "current": { "id": "claw", "mode": "system", "scope": "gateway", "overrides": {} },
        "theme": claw, "themes": [claw],
    }))
}

/// The skill workshop holds no proposals and no skills of its own.
pub(super) async fn skills_proposals_list() -> Answer {
    Ok(json!({
        "schema": "openclaw.skill-workshop.proposals-manifest.v1",
        "updatedAt": super::usage_rollup::iso_utc(now_ms()), "proposals": [], "installedSkills": [],
    }))
}

/// No memory provider can be imported from: an empty plan for the agent.
pub(super) async fn migrations_memory_plan(call: &Call<'_>) -> Answer {
    let agent_id = call.params.required_non_empty("agentId").map_err(fail)?;
    Ok(json!({ "agentId": agent_id, "workspace": "clawgate", "providers": [] }))
}

/// The schema of any config path: nothing there can be set. This gateway
/// has no OpenClaw config (`config.get` answers an empty one); it is
/// configured by flags and environment.
pub(super) async fn config_schema_lookup(call: &Call<'_>) -> Answer {
    let path = call.params.required_non_empty("path").map_err(fail)?;
    Ok(json!({
        "path": path,
        "schema": { "type": "object", "additionalProperties": false },
        "children": [],
    }))
}

//! The Control UI's side panels, answered for what this gateway is.
//!
//! The Control UI calls these on load and while chatting whether or not
//! `features.methods` lists them, and a failed answer shows as an error.
//! Each answer here is true of this gateway: it runs no cron jobs, tasks,
//! boards, projects, branches, worktrees, plugins, voice or GitHub links,
//! so those lists are empty; it has one agent with its default identity; it
//! runs on this host (`system.info`). None of these is advertised, so the
//! UI's feature pages stay hidden. Per-user UI preferences (`users.prefs.*`)
//! live in this edge process's memory: they survive reloads and reconnects
//! to the same edge, not an edge restart (documented in docs/gateway-edge.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use session_store_api::store::now_ms;

use super::{Answer, Call, fail};
use crate::edge::Edge;
use crate::params::Params;

/// Checks `params` against a closed list of keys.
fn closed(
    call: &Call<'_>,
    keys: &[&str],
) -> Result<(), (crate::frames::ErrorShape, Option<Value>)> {
    Params::new(&call.request.method, call.params(), keys)
        .map(|_| ())
        .map_err(fail)
}

/// A constant answer for a method whose params are `keys`.
pub(super) async fn constant(call: &Call<'_>, keys: &[&str], answer: Value) -> Answer {
    closed(call, keys)?;
    Ok(answer)
}

/// Answers that name the session they were asked about.
pub(super) async fn per_session(call: &Call<'_>) -> Answer {
    closed(call, &["sessionKey", "agentId"])?;
    let key = call
        .params()
        .get("sessionKey")
        .cloned()
        .unwrap_or(Value::Null);
    Ok(match call.request.method.as_str() {
        "board.get" => json!({ "sessionKey": key, "revision": 0, "tabs": [], "widgets": [] }),
        "progressCard.get" => json!({ "card": null }),
        "sessions.branches.list" => json!({ "branches": [] }),
        "session.discussion.info" => json!({ "state": "none" }),
        "sessions.companion.state" => json!({ "exchanges": [] }),
        "sessions.github.options" => json!({
            "personal": { "state": "disconnected", "generation": null, "account": null,
                "accessExpiresAtMs": null, "refreshState": "not_applicable", "pending": null },
            "shared": null, "pendingPersonal": null, "latestShared": null,
        }),
        "session.members.listEvidence" => json!({
            "sessionKey": key, "members": [], "identities": [], "role": "admin",
            "allowedVisibilities": ["shared"],
        }),
        other => unreachable!("{other} is not a per-session surface"),
    })
}

pub(super) async fn agent_identity(call: &Call<'_>) -> Answer {
    closed(call, &["agentId", "sessionKey"])?;
    Ok(json!({ "agentId": "main", "name": "Assistant", "nameSource": "default", "avatar": "A" }))
}

pub(super) async fn models_auth_status(call: &Call<'_>) -> Answer {
    closed(call, &["refresh", "agentId"])?;
    let catalog = super::catalog::runtime_catalog(call.edge).await?;
    let mut providers: Vec<&str> = catalog.models.iter().map(|m| m.provider.as_str()).collect();
    providers.sort_unstable();
    providers.dedup();
    // The runtime's credentials are the coordinator's configuration.
    let providers: Vec<Value> = providers
        .into_iter()
        .map(|p| {
            json!({
                "provider": p, "authProvider": p, "displayName": p, "status": "static",
                "profiles": [], "apiKey": { "source": "config" },
            })
        })
        .collect();
    Ok(json!({ "ts": now_ms(), "providers": providers, "providerCapabilities": [] }))
}

pub(super) async fn tasks_list(call: &Call<'_>) -> Answer {
    closed(
        call,
        &[
            "status",
            "agentId",
            "sessionKey",
            "limit",
            "cursor",
            "sortBy",
        ],
    )?;
    Ok(json!({ "tasks": [] }))
}

pub(super) const CRON_LIST_KEYS: &[&str] = &[
    "sessionKey",
    "sessionAgentId",
    "includeDisabled",
    "limit",
    "offset",
    "query",
    "enabled",
    "scheduleKind",
    "lastRunStatus",
    "trigger",
    "sortBy",
    "sortDir",
    "agentId",
    "compact",
    "includeDeliveryPreviews",
];

pub(super) async fn cron_list(call: &Call<'_>) -> Answer {
    closed(call, CRON_LIST_KEYS)?;
    let limit = call
        .params()
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(50);
    let offset = call
        .params()
        .get("offset")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(json!({
        "jobs": [], "total": 0, "offset": offset, "limit": limit,
        "hasMore": false, "nextOffset": null,
    }))
}

pub(super) async fn mentions_list(call: &Call<'_>) -> Answer {
    closed(call, &[])?;
    Ok(json!({ "gatewayInstanceId": call.edge.boot_id, "revision": 0, "items": [] }))
}

pub(super) async fn viewers_set(call: &Call<'_>) -> Answer {
    closed(call, &["sessionKeys"])?;
    let keys = call
        .params()
        .get("sessionKeys")
        .cloned()
        .unwrap_or(json!([]));
    if !keys
        .as_array()
        .is_some_and(|k| k.iter().all(Value::is_string))
    {
        return Err(fail(crate::frames::ErrorShape::invalid(
            "invalid sessions.viewers.set params: /sessionKeys must be an array of strings",
        )));
    }
    Ok(json!({ "sessionKeys": keys }))
}

pub(super) async fn environments_list(call: &Call<'_>) -> Answer {
    closed(call, &["runtimeId", "projection", "includeDesktopSetup"])?;
    Ok(json!({ "environments": [{
        "id": "gateway", "type": "local", "label": "Gateway", "status": "available",
        "platform": std::env::consts::OS, "sessionHost": true, "trust": "persistent",
        "capabilities": ["agent.run", "sessions"],
    }] }))
}

/// The host this edge runs on.
pub(super) async fn system_info(call: &Call<'_>) -> Answer {
    closed(call, &[])?;
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .ok()
    };
    let hostname = &call.edge.hostname;
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let meminfo = read("/proc/meminfo").unwrap_or_default();
    let mem_kib = |field: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    let os = std::env::consts::OS;
    Ok(crate::frames::without_nulls(json!({
        "machineName": hostname, "hostname": hostname, "platform": os, "release": release,
        "arch": arch, "osLabel": format!("{os} {release}").trim().to_owned(),
        "port": call.edge.config.listen.port(), "pid": std::process::id(),
        "processInstanceId": call.edge.boot_id,
        "uptimeMs": call.edge.started.elapsed().as_millis() as u64,
        "cpuCount": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "memoryTotalBytes": mem_kib("MemTotal:"), "memoryFreeBytes": mem_kib("MemAvailable:"),
    })))
}

/// Control UI preferences per user (the connection's requester), kept by
/// this edge process.
#[derive(Default)]
pub struct UserPrefs {
    by_user: Mutex<HashMap<String, Map<String, Value>>>,
}

/// Most preference entries one user may keep, and the largest entry (JSON).
const MAX_PREF_ENTRIES: usize = 256;
const MAX_PREF_BYTES: usize = 16 * 1024;

pub(super) async fn prefs_get(call: &Call<'_>) -> Answer {
    let p = Params::new("users.prefs.get", call.params(), &["keys"]).map_err(fail)?;
    let keys: Option<Vec<&str>> = match p.value("keys") {
        None => None,
        Some(Value::Array(keys)) => Some(
            keys.iter()
                .map(|k| {
                    k.as_str()
                        .ok_or_else(|| fail(p.error("/keys must be an array of strings")))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(fail(p.error("/keys must be array"))),
    };
    let prefs = prefs_of(call.edge);
    let all = prefs.by_user.lock().unwrap();
    let mine = all.get(&call.conn.requester);
    let entries: Map<String, Value> = mine
        .map(|m| {
            m.iter()
                .filter(|(k, _)| keys.as_ref().is_none_or(|keys| keys.contains(&k.as_str())))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({ "status": "ok", "entries": entries }))
}

pub(super) async fn prefs_set(call: &Call<'_>) -> Answer {
    let p = Params::new(
        "users.prefs.set",
        call.params(),
        &["entries", "expectedEntries"],
    )
    .map_err(fail)?;
    let Some(Value::Object(entries)) = p.value("entries") else {
        return Err(fail(
            p.error("must have required property 'entries' (an object)"),
        ));
    };
    let expected = match p.value("expectedEntries") {
        None => None,
        Some(Value::Object(e)) => Some(e),
        Some(_) => return Err(fail(p.error("/expectedEntries must be object"))),
    };
    if entries
        .values()
        .any(|v| v.to_string().len() > MAX_PREF_BYTES)
    {
        return Err(fail(
            p.error(&format!("an entry is over {MAX_PREF_BYTES} bytes")),
        ));
    }
    let prefs = prefs_of(call.edge);
    let mut all = prefs.by_user.lock().unwrap();
    let mine = all.entry(call.conn.requester.clone()).or_default();
    // Compare-and-set: each expected entry must hold (null: absent).
    if let Some(expected) = expected {
        let stale = expected
            .iter()
            .any(|(k, want)| mine.get(k).unwrap_or(&Value::Null) != want);
        if stale {
            return Ok(json!({ "status": "conflict", "entries": mine.clone() }));
        }
    }
    let mut updated = mine.clone();
    for (key, value) in entries {
        if value.is_null() {
            updated.remove(key);
        } else {
            updated.insert(key.clone(), value.clone());
        }
    }
    if updated.len() > MAX_PREF_ENTRIES {
        return Err(fail(
            p.error(&format!("more than {MAX_PREF_ENTRIES} preferences")),
        ));
    }
    *mine = updated;
    Ok(json!({ "status": "ok" }))
}

fn prefs_of(edge: &Arc<Edge>) -> &UserPrefs {
    &edge.user_prefs
}

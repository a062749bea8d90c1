//! The Control UI's side panels, answered for what this gateway is.
//!
//! The Control UI calls these on load and while chatting whether or not
//! `features.methods` lists them, and a failed answer shows as an error.
//! Each answer here is true of this gateway: it runs no cron jobs, tasks,
//! boards, projects, branches, worktrees, plugins, voice or GitHub links,
//! so those lists are empty; it has one agent with its default identity; it
//! runs on this host (`system.info`). None of these is advertised (the
//! Control UI 2026.9.6 opens every page whatever `features.methods` lists). Per-user UI preferences (`users.prefs.*`)
//! live in this edge process's memory: they survive reloads and reconnects
//! to the same edge, not an edge restart (documented in docs/gateway-edge.md).

use clawgate_common::clock::now_ms;
use serde_json::{Map, Value, json};

use super::{Answer, Call, fail};
use crate::protocol::frames::{ErrorShape, without_nulls};

/// A constant answer (its params checked by the table).
pub(super) async fn constant(answer: Value) -> Answer {
    Ok(answer)
}

/// Answers that name the session they were asked about.
pub(super) async fn per_session(call: &Call<'_>) -> Answer {
    let key = call
        .params
        .raw("sessionKey")
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

pub(super) async fn models_auth_status(call: &Call<'_>) -> Answer {
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

pub(super) async fn mentions_list(call: &Call<'_>) -> Answer {
    Ok(json!({ "gatewayInstanceId": call.edge.boot_id, "revision": 0, "items": [] }))
}

pub(super) async fn viewers_set(call: &Call<'_>) -> Answer {
    let keys = call.params.raw("sessionKeys").cloned().unwrap_or(json!([]));
    if !keys
        .as_array()
        .is_some_and(|k| k.iter().all(Value::is_string))
    {
        return Err(fail(ErrorShape::invalid(
            "invalid sessions.viewers.set params: /sessionKeys must be an array of strings",
        )));
    }
    Ok(json!({ "sessionKeys": keys }))
}

pub(super) async fn environments_list() -> Answer {
    Ok(json!({ "environments": [{
        "id": "gateway", "type": "local", "label": "Gateway", "status": "available",
        "platform": std::env::consts::OS, "sessionHost": true, "trust": "persistent",
        "capabilities": ["agent.run", "sessions"],
    }] }))
}

/// The host this edge runs on.
pub(super) async fn system_info(call: &Call<'_>) -> Answer {
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
    Ok(without_nulls(json!({
        "machineName": hostname, "hostname": hostname, "platform": os, "release": release,
        "arch": arch, "osLabel": format!("{os} {release}").trim().to_owned(),
        "port": call.edge.config.listen.port(), "pid": std::process::id(),
        "processInstanceId": call.edge.boot_id,
        "uptimeMs": call.edge.started.elapsed().as_millis() as u64,
        "cpuCount": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "memoryTotalBytes": mem_kib("MemTotal:"), "memoryFreeBytes": mem_kib("MemAvailable:"),
    })))
}

/// Most preference entries one user may keep, the largest entry (JSON)
/// and the longest key.
const MAX_PREF_ENTRIES: usize = 256;
const MAX_PREF_BYTES: usize = 16 * 1024;
const MAX_PREF_KEY_BYTES: usize = 256;

pub(super) async fn prefs_get(call: &Call<'_>) -> Answer {
    let p = &call.params;
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
    let entries: Map<String, Value> = call.edge.user_prefs.read(&call.conn.requester, |mine| {
        mine.map(|m| {
            m.iter()
                .filter(|(k, _)| keys.as_ref().is_none_or(|keys| keys.contains(&k.as_str())))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
    });
    Ok(json!({ "status": "ok", "entries": entries }))
}

pub(super) async fn prefs_set(call: &Call<'_>) -> Answer {
    let p = &call.params;
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
    if entries.keys().any(|k| k.len() > MAX_PREF_KEY_BYTES) {
        return Err(fail(
            p.error(&format!("a key is over {MAX_PREF_KEY_BYTES} bytes")),
        ));
    }
    if entries
        .values()
        .any(|v| v.to_string().len() > MAX_PREF_BYTES)
    {
        return Err(fail(
            p.error(&format!("an entry is over {MAX_PREF_BYTES} bytes")),
        ));
    }
    let updated = call.edge.user_prefs.update(&call.conn.requester, |mine| {
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
    });
    updated.unwrap_or_else(|full| {
        call.edge.metrics.limit_hit("EDGE_USER_PREFS");
        Err(fail(ErrorShape::unavailable(full)))
    })
}

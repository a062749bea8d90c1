//! `sessions.list`, `sessions.reset`, `sessions.delete`, and
//! `sessions.subscribe` / `sessions.unsubscribe`.

use std::sync::Arc;

use serde_json::{Value, json};
use session_store_api::SessionStore;
use session_store_api::model::ListQuery;
use session_store_api::store::now_ms;

use super::{Answer, fail, key_for, store_error};
use crate::conn::Conn;
use crate::edge::Edge;
use crate::frames::{self, ErrorShape};
use crate::params::Params;

fn session_row(s: &session_store_api::model::Session) -> Value {
    use session_store_api::model::RunStatus as S;
    let status = s.last_run_status.map(|status| match status {
        S::Accepted | S::Queued | S::Running => "running",
        S::Ok => "done",
        S::Error | S::Lost => "failed",
        S::Aborted | S::Superseded => "killed",
        S::Timeout => "timeout",
    });
    frames::without_nulls(json!({
        "key": s.key.as_str(),
        "kind": if s.key.as_str() == "global" { "global" } else { "direct" },
        "updatedAt": s.updated_at_ms,
        "sessionId": s.session_id.to_string(),
        "label": s.label,
        "status": status,
        "hasActiveRun": s.active_writer_run_id.is_some(),
    }))
}

pub(super) const SESSIONS_LIST_KEYS: &[&str] = &[
    "limit",
    "activeMinutes",
    "includeGlobal",
    "includeUnknown",
    "includeDerivedTitles",
    "includeLastMessage",
    "label",
    "spawnedBy",
    "agentId",
    "search",
];

pub(super) async fn sessions_list(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("sessions.list", params, SESSIONS_LIST_KEYS).map_err(fail)?;
    let limit = p.integer("limit", 1, 1000).map_err(fail)?.unwrap_or(100) as u32;
    let active_minutes = p.integer("activeMinutes", 1, 10_000_000).map_err(fail)?;
    let search = p
        .string("search")
        .map_err(fail)?
        .or(p.string("label").map_err(fail)?);
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit,
            updated_since_ms: active_minutes.map(|m| now_ms() - m as i64 * 60_000),
            search: search.map(str::to_owned),
        })
        .await
        .map_err(store_error)?;
    let rows: Vec<Value> = sessions.iter().map(session_row).collect();
    // `defaults` members are nullable in the schema, so nulls stay here.
    Ok(json!({
        "ts": now_ms(), "path": "session-store", "count": rows.len(),
        "defaults": { "modelProvider": null, "model": null, "contextTokens": null },
        "sessions": rows,
    }))
}

fn notify_sessions_changed(edge: &Arc<Edge>, key: &str, reason: &str) {
    let payload = json!({ "sessionKey": key, "reason": reason, "ts": now_ms() });
    for conn in edge.connections() {
        if conn.subscribed_to_sessions() && conn.can_read() {
            conn.outbox.targeted("sessions.changed", &payload, true);
        }
    }
}

pub(super) const SESSIONS_RESET_KEYS: &[&str] = &["key", "reason"];

pub(super) async fn sessions_reset(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("sessions.reset", params, SESSIONS_RESET_KEYS).map_err(fail)?;
    let key = key_for("sessions.reset", p.required_non_empty("key").map_err(fail)?)?;
    let reason = match p.string("reason").map_err(fail)? {
        None | Some("reset") => "reset",
        Some("new") => "new",
        Some(_) => {
            return Err(fail(
                p.error("/reason must be equal to one of the allowed values"),
            ));
        }
    };
    let out = edge
        .backends
        .store
        .reset_session(&key)
        .await
        .map_err(store_error)?;
    notify_sessions_changed(edge, key.as_str(), reason);
    Ok(json!({ "ok": true, "key": key.as_str(), "entry": session_row(&out.session) }))
}

pub(super) const SESSIONS_DELETE_KEYS: &[&str] = &["key", "deleteTranscript", "emitLifecycleHooks"];

pub(super) async fn sessions_delete(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("sessions.delete", params, SESSIONS_DELETE_KEYS).map_err(fail)?;
    let key = key_for(
        "sessions.delete",
        p.required_non_empty("key").map_err(fail)?,
    )?;
    if key.as_str() == "agent:main:main" {
        return Err(fail(ErrorShape::invalid(
            "Cannot delete the main session (main).",
        )));
    }
    let delete_transcript = p.boolean("deleteTranscript").map_err(fail)?.unwrap_or(true);
    let out = edge
        .backends
        .store
        .delete_session(&key, delete_transcript)
        .await
        .map_err(store_error)?;
    if out.deleted {
        notify_sessions_changed(edge, key.as_str(), "delete");
    }
    Ok(json!({ "ok": true, "key": key.as_str(), "deleted": out.deleted, "archived": [] }))
}

/// `sessions.subscribe` (`on`) and `sessions.unsubscribe`: whether the
/// connection gets `sessions.changed` events.
pub(super) async fn subscribe(conn: &Conn, on: bool) -> Answer {
    conn.sessions_subscribed
        .store(on, std::sync::atomic::Ordering::Relaxed);
    Ok(json!({ "subscribed": on }))
}

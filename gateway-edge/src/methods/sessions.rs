//! The session rows, `sessions.describe`, `sessions.resolve`,
//! `sessions.reset`, `sessions.delete`, and the subscriptions
//! (`sessions.subscribe` / `sessions.unsubscribe` for `sessions.changed`,
//! `sessions.messages.subscribe` for `session.message`).

use std::sync::Arc;

use clawgate_common::clock::now_ms;
use run_coordinator_api::model::RunStatus as S;
use serde_json::{Value, json};
use session_store_api::model::{ListQuery, PatchSession, Session};
use session_store_api::{SessionKey, SessionStore};

use super::session_list::{active_runs, add_previews};
use super::{Answer, Call, backend_error, fail, key_for, store_error};
use crate::protocol::frames::{self, ErrorShape};
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::connection::Conn;

/// The one agent this edge runs.
pub(super) const AGENT_ID: &str = "main";

/// A session as the protocol lists it.
pub(super) fn session_row(s: &Session, active: &[String]) -> Value {
    let status = if active.is_empty() {
        s.last_run_status.map(|status| match status {
            S::Accepted | S::Queued | S::Running => "running",
            S::Ok => "done",
            S::Error | S::Lost => "failed",
            S::Aborted | S::Superseded => "killed",
            S::Timeout => "timeout",
        })
    } else {
        Some("running")
    };
    let mut row = json!({
        "key": s.key.as_str(),
        "agentId": AGENT_ID,
        "kind": if s.key.as_str() == "global" { "global" } else { "direct" },
        "isMain": s.key.as_str() == MAIN_KEY,
        "updatedAt": s.updated_at_ms,
        "createdAt": s.created_at_ms,
        "sessionId": s.session_id.to_string(),
        "label": s.label,
        "status": status,
        "hasActiveRun": !active.is_empty() || s.active_writer_run_id.is_some(),
        "activeRunIds": (!active.is_empty()).then_some(active),
        "archived": false,
        "pinned": false,
        "unread": false,
        "messageCount": s.entry_count,
    });
    let settings = super::session_settings::settings_of(s);
    for (key, value) in &settings {
        match key.as_str() {
            // This edge's own record, not a client's setting.
            RESET_SETTING => {}
            "markedUnreadAt" => row["unread"] = json!(!value.is_null()),
            "model" => {
                if let Some((provider, model)) = value.as_str().and_then(|m| m.split_once('/')) {
                    row["modelProvider"] = json!(provider);
                    row["model"] = json!(model);
                    row["modelOverrideSource"] = json!("session");
                }
            }
            "queueMode" => row["queueMode"] = value.clone(),
            _ => row[key.as_str()] = value.clone(),
        }
    }
    if row.get("displayName").is_none_or(Value::is_null) {
        row["displayName"] = json!(s.label);
    }
    frames::without_nulls(row)
}

/// The agent's main session.
const MAIN_KEY: &str = "agent:main:main";

/// What a chat view needs about its session besides the messages.
pub(super) struct SessionInfo {
    /// `sessionInfo` of a history answer.
    pub info: Value,
    /// The run streaming now (`inFlightRun`), so a reloaded view resumes it.
    pub in_flight: Option<Value>,
    pub thinking_level: Option<String>,
}

/// `sessionInfo` of `key` (`session`: its row, if it has one).
pub(super) async fn session_info(
    edge: &Arc<Edge>,
    key: &SessionKey,
    session: Option<&Session>,
) -> Result<SessionInfo, (ErrorShape, Option<Value>)> {
    let active = edge
        .backends
        .coordinator
        .list_active(Some(key))
        .await
        .map_err(backend_error)?;
    let running = active.iter().find(|run| run.status == S::Running);
    let in_flight = running.map(|run| {
        frames::without_nulls(json!({
            "runId": run.run_id, "text": run.outcome.text, "startedAt": run.started_at_ms,
        }))
    });
    let queue_mode = super::session_settings::queue_mode_of(edge, session);
    let run_ids: Vec<String> = active.iter().map(|r| r.run_id.clone()).collect();
    // The session's row, with what a chat view adds to it.
    let mut info = match session {
        Some(session) => session_row(session, &run_ids),
        None => json!({ "key": key.as_str(), "agentId": AGENT_ID }),
    };
    info["effectiveQueueMode"] = json!(queue_mode.as_str());
    info["hasActiveRun"] = json!(!active.is_empty());
    info["status"] = json!(if active.is_empty() { "idle" } else { "running" });
    info["activeRunIds"] = json!(run_ids);
    let thinking_level = info
        .get("thinkingLevel")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(SessionInfo {
        info,
        in_flight,
        thinking_level,
    })
}

pub(super) const SESSIONS_DESCRIBE_KEYS: &[&str] = &[
    "key",
    "agentId",
    "includeDerivedTitles",
    "includeLastMessage",
];

pub(super) async fn sessions_describe(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    let key = key_for(
        "sessions.describe",
        p.required_non_empty("key").map_err(fail)?,
    )?;
    check_agent(p)?;
    let titles = p.boolean("includeDerivedTitles").map_err(fail)? == Some(true);
    let last = p.boolean("includeLastMessage").map_err(fail)? == Some(true);
    let Some(session) = edge
        .backends
        .store
        .get_session(&key)
        .await
        .map_err(store_error)?
    else {
        return Ok(json!({ "session": null }));
    };
    let runs: Vec<String> = active_runs(edge)
        .await?
        .into_iter()
        .filter(|(k, _)| k == key.as_str())
        .map(|(_, r)| r)
        .collect();
    let mut row = session_row(&session, &runs);
    if titles || last {
        add_previews(edge, &session, &mut row, titles, last).await?;
    }
    Ok(json!({ "session": row }))
}

/// `agentId`, when given, must be this edge's one agent.
pub(super) fn check_agent(p: &Params) -> Result<(), (ErrorShape, Option<Value>)> {
    match p.optional_non_empty("agentId").map_err(fail)? {
        Some(agent) if agent != AGENT_ID => Err(fail(
            ErrorShape::invalid(format!("unknown agent id: {agent}"))
                .with_details(json!({ "code": "UNKNOWN_AGENT_ID", "agentId": agent })),
        )),
        _ => Ok(()),
    }
}

pub(super) const SESSIONS_RESOLVE_KEYS: &[&str] = &[
    "key",
    "sessionId",
    "label",
    "reference",
    "shortId",
    "slugHint",
    "agentId",
    "spawnedBy",
    "includeGlobal",
    "includeUnknown",
    "allowMissing",
];

pub(super) async fn sessions_resolve(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    check_agent(p)?;
    let allow_missing = p.boolean("allowMissing").map_err(fail)? == Some(true);
    let reference_key = match p.value("reference") {
        None => None,
        Some(Value::Object(r)) => match r.get("key").and_then(Value::as_str) {
            Some(k) if !k.is_empty() => Some(k),
            _ => {
                return Err(fail(
                    p.error("/reference must have required property 'key'"),
                ));
            }
        },
        Some(_) => return Err(fail(p.error("/reference must be object"))),
    };
    let store = &edge.backends.store;
    let found: Option<SessionKey> =
        if let Some(raw) = p.optional_non_empty("key").map_err(fail)?.or(reference_key) {
            let key = key_for("sessions.resolve", raw)?;
            store
                .get_session(&key)
                .await
                .map_err(store_error)?
                .map(|s| s.key)
        } else if let Some(short) = p.optional_non_empty("shortId").map_err(fail)? {
            resolve_short_id(edge, short).await.ok()
        } else if let Some(id) = p.optional_non_empty("sessionId").map_err(fail)? {
            find_session(edge, |s| s.session_id.to_string() == id).await?
        } else if let Some(label) = p.optional_non_empty("label").map_err(fail)? {
            find_session(edge, |s| s.label.as_deref() == Some(label)).await?
        } else {
            return Err(fail(
                p.error("give one of key, sessionId, label, reference or shortId"),
            ));
        };
    match found {
        Some(key) => Ok(json!({ "ok": true, "key": key.as_str() })),
        None if allow_missing => Ok(json!({ "ok": false })),
        None => Err(fail(ErrorShape::invalid("No session found"))),
    }
}

/// Sessions a lookup by id or label scans (newest first).
const RESOLVE_SCAN: u32 = 1000;

async fn find_session(
    edge: &Arc<Edge>,
    matches: impl Fn(&Session) -> bool,
) -> Result<Option<SessionKey>, (ErrorShape, Option<Value>)> {
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: RESOLVE_SCAN,
            ..ListQuery::default()
        })
        .await
        .map_err(store_error)?;
    Ok(sessions.into_iter().find(|s| matches(s)).map(|s| s.key))
}

/// The session whose key ends in a UUID starting with `short_id` (8 to 32
/// hex digits); an error if none or several.
pub(super) async fn resolve_short_id(
    edge: &Arc<Edge>,
    short_id: &str,
) -> Result<SessionKey, (ErrorShape, Option<Value>)> {
    let short = short_id.to_ascii_lowercase();
    if !(8..=32).contains(&short.len()) || !short.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(fail(ErrorShape::invalid(
            "shortId must be 8 to 32 hexadecimal digits",
        )));
    }
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: RESOLVE_SCAN,
            search: Some(short[..8].to_owned()),
            ..ListQuery::default()
        })
        .await
        .map_err(store_error)?;
    let mut found = sessions.into_iter().filter(|s| {
        let tail = s.key.as_str().rsplit(':').next().unwrap_or("");
        tail.replace('-', "")
            .to_ascii_lowercase()
            .starts_with(&short)
    });
    match (found.next(), found.next()) {
        (Some(session), None) => Ok(session.key),
        (None, _) => Err(fail(ErrorShape::invalid(format!(
            "No session found for shortId {short_id}"
        )))),
        (Some(_), Some(_)) => Err(fail(ErrorShape::invalid(format!(
            "shortId {short_id} matches several sessions"
        )))),
    }
}

/// Tells `sessions.changed` subscribers that `key` changed.
/// `sessions.changed` for `key`, sent once this call's answer is queued:
/// the protocol orders the answer first, so a client that reloads on the
/// event already knows what changed.
pub(super) fn changed_after_reply(
    call: &Call<'_>,
    key: &SessionKey,
    session_id: Option<String>,
    reason: impl Into<String>,
) {
    let (edge, key, reason) = (call.edge.clone(), key.as_str().to_owned(), reason.into());
    call.after_reply(move || notify_sessions_changed(&edge, &key, session_id.as_deref(), &reason));
}

pub(super) fn notify_sessions_changed(
    edge: &Arc<Edge>,
    key: &str,
    session_id: Option<&str>,
    reason: &str,
) {
    let payload = frames::without_nulls(json!({
        "sessionKey": key, "sessionId": session_id, "reason": reason, "ts": now_ms(),
    }));
    for conn in edge.connections() {
        if conn.subscribed_to_sessions() && conn.can_read() {
            conn.outbox.targeted("sessions.changed", &payload, true);
        }
    }
}

pub(super) const SESSIONS_RESET_KEYS: &[&str] = &["key", "agentId", "reason", "expectedSessionId"];

/// The session setting in which a reset records what it did (kept with
/// the other settings in the store, never shown as one):
/// `{sessionId, previousSessionId, at, reason}`, `sessionId` being the
/// transcript the reset started. A reset gives the session a new
/// transcript (a new `sessionId`); this record is how a history read knows
/// that the transcript it pages replaced another, and shows the reset
/// marker at its start (`history.rs`). A later reset overwrites it.
pub(super) const RESET_SETTING: &str = "lastReset";

/// The reset recorded for `session`'s current transcript, if its
/// transcript is one a reset started: `(at, reason)`.
pub(super) fn reset_of(session: &Session) -> Option<(i64, String)> {
    let settings = super::session_settings::settings_of(session);
    let reset = settings.get(RESET_SETTING)?;
    (reset["sessionId"].as_str() == Some(session.session_id.to_string().as_str())).then(|| {
        (
            reset["at"].as_i64().unwrap_or(session.created_at_ms),
            reset["reason"].as_str().unwrap_or("reset").to_owned(),
        )
    })
}

/// Resets `key`: a new transcript, the settings kept, and when it replaced
/// one, the reset recorded (`RESET_SETTING`). The record is a second
/// write: should it fail, the reset stands and only its marker is missing.
pub(super) async fn reset_session(
    edge: &Arc<Edge>,
    key: &SessionKey,
    reason: &str,
) -> Result<Session, (ErrorShape, Option<Value>)> {
    let store = &edge.backends.store;
    let out = store.reset_session(key).await.map_err(store_error)?;
    let Some(previous) = out.previous_session_id else {
        return Ok(out.session);
    };
    let record = json!({ RESET_SETTING: {
        "sessionId": out.session.session_id.to_string(),
        "previousSessionId": previous.to_string(),
        "at": out.session.created_at_ms,
        "reason": reason,
    }});
    let patched = store
        .patch_session(PatchSession {
            key: key.clone(),
            patch_json: record.to_string(),
            create: false,
        })
        .await;
    match patched {
        // Unless the session changed again in between.
        Ok(patched) if patched.session.session_id == out.session.session_id => Ok(patched.session),
        Ok(_) => Ok(out.session),
        Err(err) => {
            clawgate_telemetry::limited!(warn, session = key.as_str(), error = %err, "the reset marker was not recorded");
            Ok(out.session)
        }
    }
}

pub(super) async fn sessions_reset(call: &Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    let key = key_for("sessions.reset", p.required_non_empty("key").map_err(fail)?)?;
    check_agent(p)?;
    let reason = p
        .one_of("reason", &["new", "reset"])
        .map_err(fail)?
        .unwrap_or("reset");
    let reason = reason.to_owned();
    let expected = p.optional_non_empty("expectedSessionId").map_err(fail)?;
    let current = session_if(edge, &key, expected.is_some()).await?;
    check_session_id(current.as_ref(), expected)?;
    let session = reset_session(edge, &key, &reason).await?;
    changed_after_reply(call, &key, Some(session.session_id.to_string()), reason);
    Ok(json!({ "ok": true, "key": key.as_str(), "entry": session_row(&session, &[]) }))
}

/// `SESSION_CHANGED`: an expectation (`what`) about the session no
/// longer holds.
pub(super) fn session_changed(what: &str) -> (ErrorShape, Option<Value>) {
    fail(
        ErrorShape::invalid(format!("session changed: {what} does not match"))
            .with_details(json!({ "code": "SESSION_CHANGED" })),
    )
}

/// `expectedSessionId` against the session as it is now: refused if the
/// session was reset or replaced since.
pub(super) fn check_session_id(
    current: Option<&Session>,
    expected: Option<&str>,
) -> Result<(), (ErrorShape, Option<Value>)> {
    match expected {
        Some(expected) if current.is_none_or(|s| s.session_id.to_string() != expected) => {
            Err(session_changed("expectedSessionId"))
        }
        _ => Ok(()),
    }
}

/// The session's row when `needed` (an expectation or filter asks about it).
async fn session_if(
    edge: &Arc<Edge>,
    key: &SessionKey,
    needed: bool,
) -> Result<Option<Session>, (ErrorShape, Option<Value>)> {
    if !needed {
        return Ok(None);
    }
    edge.backends
        .store
        .get_session(key)
        .await
        .map_err(store_error)
}

pub(super) const SESSIONS_DELETE_KEYS: &[&str] = &[
    "key",
    "agentId",
    "deleteTranscript",
    "expectedSessionId",
    "expectedLifecycleRevision",
    "expectedSessionUpdatedAt",
    "emitLifecycleHooks",
    "archivedOnly",
];

/// `sessions.delete` needs admin, or write when it deletes only an
/// archived session (`archivedOnly`).
pub(super) fn delete_scope(params: &Value) -> &'static str {
    if params.get("archivedOnly") == Some(&Value::Bool(true)) {
        crate::auth::scopes::WRITE
    } else {
        crate::auth::scopes::ADMIN
    }
}

pub(super) async fn sessions_delete(call: &Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    let key = key_for(
        "sessions.delete",
        p.required_non_empty("key").map_err(fail)?,
    )?;
    check_agent(p)?;
    if key.as_str() == "agent:main:main" {
        return Err(fail(ErrorShape::invalid(
            "Cannot delete the main session (main).",
        )));
    }
    p.optional_non_empty("expectedLifecycleRevision")
        .map_err(fail)?;
    p.boolean("emitLifecycleHooks").map_err(fail)?;
    let delete_transcript = p.boolean("deleteTranscript").map_err(fail)?.unwrap_or(true);
    let expected_id = p.optional_non_empty("expectedSessionId").map_err(fail)?;
    let expected_at = match p.value("expectedSessionUpdatedAt") {
        None => None,
        Some(at) => Some(
            at.as_f64()
                .filter(|n| *n >= 0.0)
                .ok_or_else(|| fail(p.error("/expectedSessionUpdatedAt must be >= 0")))?,
        ),
    };
    let archived_only = p.boolean("archivedOnly").map_err(fail)? == Some(true);
    // One read serves every expectation and the archive check.
    let needed = expected_id.is_some() || expected_at.is_some() || archived_only;
    let current = session_if(edge, &key, needed).await?;
    check_session_id(current.as_ref(), expected_id)?;
    if let Some(at) = expected_at
        && current
            .as_ref()
            .is_some_and(|s| s.updated_at_ms as f64 != at)
    {
        return Err(session_changed("expectedSessionUpdatedAt"));
    }
    if archived_only {
        let archived = current
            .as_ref()
            .map(super::session_settings::settings_of)
            .is_some_and(|s| s.get("archived") == Some(&Value::Bool(true)));
        if !archived {
            // An archive-only delete deletes nothing that is not archived.
            return Ok(
                json!({ "ok": true, "key": key.as_str(), "deleted": false, "archived": [] }),
            );
        }
    }
    let out = edge
        .backends
        .store
        .delete_session(&key, delete_transcript)
        .await
        .map_err(store_error)?;
    if out.deleted {
        changed_after_reply(call, &key, None, "delete");
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

pub(super) const MESSAGES_SUBSCRIBE_KEYS: &[&str] = &["key", "agentId", "includeApprovals"];
pub(super) const MESSAGES_UNSUBSCRIBE_KEYS: &[&str] = &["key", "agentId"];

/// `sessions.messages.subscribe` (`on`) / `unsubscribe`: whether the
/// connection gets `key`'s `session.message` events (`session_feed.rs`).
pub(super) async fn messages_subscribe(call: &Call<'_>, on: bool) -> Answer {
    let p = &call.params;
    let method = p.method();
    let key = key_for(method, p.required_non_empty("key").map_err(fail)?)?;
    check_agent(p)?;
    let approvals = on && p.boolean("includeApprovals").map_err(fail)? == Some(true);
    if on {
        let max = call.edge.config.max_watched_sessions;
        let full = {
            let watched = call.conn.message_watch.lock().unwrap();
            watched.len() >= max && !watched.contains(key.as_str())
        };
        if full {
            call.edge.metrics.limit_hit("EDGE_MAX_WATCHED_SESSIONS");
            return Err(fail(ErrorShape::invalid(format!(
                "this connection watches too many sessions (at most {max}, EDGE_MAX_WATCHED_SESSIONS): unsubscribe from one first"
            )).with_details(json!({ "code": "TOO_MANY_WATCHED_SESSIONS", "limit": max }))));
        }
        call.events.feed.follow(call.edge, &key).await;
        call.conn
            .message_watch
            .lock()
            .unwrap()
            .insert(key.as_str().to_owned());
    } else {
        call.conn.message_watch.lock().unwrap().remove(key.as_str());
    }
    let mut answer = json!({ "subscribed": on, "key": key.as_str() });
    if approvals {
        // No runtime here asks for approvals: there are none to replay.
        answer["approvalReplay"] = json!({
            "sessionKey": key.as_str(), "updatedAtMs": now_ms(), "approvals": [], "truncated": false,
        });
    }
    Ok(answer)
}

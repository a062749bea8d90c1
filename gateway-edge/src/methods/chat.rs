//! `chat.send` and `chat.abort`.

use std::sync::Arc;
use std::time::Instant;

use clawgate_proto::run_coordinator::v1 as pb;
use serde_json::{Value, json};
use session_store_api::SessionStore;

use super::{Answer, backend_error, fail, key_for};
use crate::config::QueueMode;
use crate::conn::Conn;
use crate::edge::Edge;
use crate::fanout::status_name;
use crate::frames::ErrorShape;
use crate::params::Params;
use crate::settings_cache::TurnSettings;
use crate::trace;

pub(super) const CHAT_SEND_KEYS: &[&str] = &[
    "sessionKey",
    "message",
    "mentions",
    "workContext",
    "intent",
    "idempotencyKey",
    "thinking",
    "deliver",
    "originatingChannel",
    "originatingTo",
    "originatingAccountId",
    "originatingThreadId",
    "attachments",
    "timeoutMs",
    "systemInputProvenance",
    "systemProvenanceReceipt",
    "agentId",
    "sessionId",
    "fastMode",
    "fastAutoOnSeconds",
    "queueMode",
    "replyToId",
    "toolBindings",
    "suppressCommandInterpretation",
    "expectedLeafEntryId",
    "expectedSessionRoutingContract",
    "expectedPermissionMode",
    "expectedToolOverrides",
];

/// The marker the Control UI puts on its first send after a reconnect. It
/// is not part of the schema: the protocol strips it from operator UI
/// clients' sends before validating them.
const RECONNECT_MARKER: &str = "__controlUiReconnectResume";

/// Client modes whose sends may carry the reconnect marker.
const UI_MODES: &[&str] = &["webchat", "ui"];

pub(super) async fn chat_send(call: &super::Call<'_>) -> Answer {
    let (edge, conn, params, received) = (call.edge, call.conn, call.params(), call.received);
    let stripped;
    let params = match params.as_object() {
        Some(object)
            if object.contains_key(RECONNECT_MARKER)
                && UI_MODES.contains(&conn.client.mode.as_str()) =>
        {
            let mut object = object.clone();
            object.remove(RECONNECT_MARKER);
            stripped = Value::Object(object);
            &stripped
        }
        _ => params,
    };
    let p = Params::new("chat.send", params, CHAT_SEND_KEYS).map_err(fail)?;
    let attachments = super::attachments::parse(edge, "chat.send", params)?;
    let raw_key = p.required_non_empty("sessionKey").map_err(fail)?;
    let message = p.required_string("message").map_err(fail)?;
    let key = p.required_non_empty("idempotencyKey").map_err(fail)?;
    trace::record_run(key);
    if message.contains('\0') {
        return Err(fail(ErrorShape::invalid(
            "message must not contain null bytes",
        )));
    }
    if message.trim().is_empty() && attachments.is_empty() {
        return Err(fail(ErrorShape::invalid("message or attachment required")));
    }
    let session = key_for("chat.send", raw_key)?;
    let queue_mode = p
        .one_of("queueMode", QueueMode::NAMES)
        .map_err(fail)?
        .and_then(|mode| <QueueMode as clap::ValueEnum>::from_str(mode, false).ok())
        .map(queue_mode_to_pb);
    // Checked before a slash command runs too: the params are the same
    // closed schema whatever the message says.
    let timeout_ms = p
        .integer("timeoutMs", 0, 48 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(0);
    if super::commands::interpreted(params)
        && let Some(command) = super::commands::parse(message).map_err(fail)?
    {
        return super::commands::run(call, &session, key, command, received).await;
    }
    start_turn(
        edge,
        conn,
        Turn {
            session: &session,
            run_id: key,
            message,
            queue_mode,
            timeout_ms,
            attachments,
        },
        received,
    )
    .await
}

/// A chat turn to submit.
pub(super) struct Turn<'a> {
    pub session: &'a session_store_api::SessionKey,
    /// The idempotency key (the run's id).
    pub run_id: &'a str,
    pub message: &'a str,
    /// `None`: the session's queue mode, or the gateway's default.
    pub queue_mode: Option<pb::QueueMode>,
    pub timeout_ms: u64,
    pub attachments: Vec<clawgate_proto::agent_runtime::v1::Attachment>,
}

/// The coordinator's name for a queue mode.
pub(super) fn queue_mode_to_pb(mode: QueueMode) -> pb::QueueMode {
    match mode {
        QueueMode::Steer => pb::QueueMode::Steer,
        QueueMode::Followup => pb::QueueMode::Enqueue,
        QueueMode::Collect => pb::QueueMode::Collect,
        QueueMode::Interrupt => pb::QueueMode::Interrupt,
    }
}

/// How many times a send reads its session's settings again after the
/// store said they changed, before it gives up.
const SETTINGS_RETRIES: usize = 3;

/// Submits `turn` with the session's settings (its model, its queue mode):
/// the cached ones when this edge has them, else read from the store. The
/// store admits the run only with the settings it was made from (see
/// `settings_cache`); when they changed, they are read again and the turn
/// is submitted again with the same runId (nothing was admitted).
async fn submit_with_settings(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    turn: &Turn<'_>,
) -> Result<pb::SubmitResponse, (ErrorShape, Option<Value>)> {
    let mut cached = edge.settings_cache.get(turn.session);
    let mut attempts = 0;
    loop {
        let settings = match cached.take() {
            Some(settings) => settings,
            None => super::session_settings::read_turn_settings(edge, turn.session).await?,
        };
        let settings = match settings.digest {
            Some(_) => settings,
            // A new session is in the store before its first send is
            // answered, as the protocol's clients expect (`sessions.describe`
            // right after the ack); the run's writer fence would create it
            // only when it starts.
            None => create_session(edge, turn.session).await?,
        };
        let queue_mode = turn
            .queue_mode
            .unwrap_or(queue_mode_to_pb(settings.queue_mode));
        let submit = pb::SubmitRequest {
            run_id: turn.run_id.to_owned(),
            session_key: turn.session.as_str().to_owned(),
            kind: "chat".into(),
            message: turn.message.to_owned(),
            queue_mode: queue_mode as i32,
            timeout_ms: turn.timeout_ms,
            options_json: settings.options_json,
            requester: conn.requester.clone(),
            label: None,
            attachments: turn.attachments.clone(),
            expected_settings_digest: settings.digest,
        };
        // Same runId on every attempt: a retry after a failover is idempotent.
        match edge.backends.coordinator.submit(submit).await {
            Err(status)
                if crate::coordinators::settings_changed(&status)
                    && attempts < SETTINGS_RETRIES =>
            {
                edge.settings_cache.forget(turn.session);
                attempts += 1;
            }
            done => return done.map_err(backend_error),
        }
    }
}

/// Creates the row of a session sent to for the first time; its settings.
async fn create_session(
    edge: &Arc<Edge>,
    key: &session_store_api::SessionKey,
) -> Result<TurnSettings, (ErrorShape, Option<Value>)> {
    let created = edge
        .backends
        .store
        .patch_session(session_store_api::model::PatchSession {
            key: key.clone(),
            patch_json: "{}".into(),
            create: true,
        })
        .await
        .map_err(super::store_error)?;
    let settings = super::session_settings::turn_settings_of(edge, Some(&created.session));
    edge.settings_cache.put(key, &settings);
    Ok(settings)
}

/// Submits a chat turn with the session's settings (its model) and answers
/// as `chat.send` does: `started`, `in_flight`, or the finished run's end.
pub(super) async fn start_turn(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    turn: Turn<'_>,
    received: Instant,
) -> Answer {
    let key = turn.run_id;
    // Awaited from before its Submit (see `Edge::await_run`).
    edge.await_run(key);
    let done = match submit_with_settings(edge, conn, &turn).await {
        Ok(done) => done,
        Err(refused) => {
            edge.unawait_run(key);
            return Err(refused);
        }
    };
    let snapshot = done.snapshot.unwrap_or_default();
    if done.admission == pb::Admission::Completed as i32 {
        edge.unawait_run(key);
    }
    match pb::Admission::try_from(done.admission) {
        Ok(pb::Admission::Accepted) => {
            edge.metrics.acked("chat.send", received);
            Ok(json!({ "runId": key, "status": "started" }))
        }
        Ok(pb::Admission::InFlight) => Ok(json!({ "runId": key, "status": "in_flight" })),
        _ => match status_name(snapshot.status) {
            "ok" => Ok(json!({ "runId": key, "status": "ok" })),
            other => {
                let summary = snapshot
                    .error
                    .as_ref()
                    .map_or_else(|| format!("run {other}"), |e| e.message.clone());
                Err((
                    ErrorShape::unavailable(summary.clone()),
                    Some(json!({ "runId": key, "status": "error", "summary": summary })),
                ))
            }
        },
    }
}

fn owns(conn: &Conn, snapshot: &pb::RunSnapshot) -> bool {
    conn.is_admin() || snapshot.requester.is_empty() || snapshot.requester == conn.requester
}

fn is_active(snapshot: &pb::RunSnapshot) -> bool {
    matches!(
        status_name(snapshot.status),
        "accepted" | "queued" | "running"
    )
}

pub(super) const CHAT_ABORT_KEYS: &[&str] = &[
    "sessionKey",
    "runId",
    "agentId",
    "preserveSideRuns",
    "exemptRunId",
];

pub(super) async fn chat_abort(edge: &Arc<Edge>, conn: &Arc<Conn>, params: &Value) -> Answer {
    let p = Params::new("chat.abort", params, CHAT_ABORT_KEYS).map_err(fail)?;
    let session = key_for(
        "chat.abort",
        p.required_non_empty("sessionKey").map_err(fail)?,
    )?;
    let run_id = p.optional_non_empty("runId").map_err(fail)?;
    abort(edge, conn, &session, run_id).await
}

pub(super) const SESSIONS_ABORT_KEYS: &[&str] = &["key", "agentId", "runId", "clearQueued"];

/// `sessions.abort`: `chat.abort` by session key. Queued runs of the
/// session are aborted with the active one whether or not `clearQueued`
/// says so (a queued run here is a run: it is cancelled as one).
pub(super) async fn sessions_abort(edge: &Arc<Edge>, conn: &Arc<Conn>, params: &Value) -> Answer {
    let p = Params::new("sessions.abort", params, SESSIONS_ABORT_KEYS).map_err(fail)?;
    let session = key_for("sessions.abort", p.required_non_empty("key").map_err(fail)?)?;
    p.boolean("clearQueued").map_err(fail)?;
    let run_id = p.optional_non_empty("runId").map_err(fail)?;
    let mut answer = abort(edge, conn, &session, run_id).await?;
    let aborted = answer["aborted"] == true;
    answer["status"] = json!(if aborted { "aborted" } else { "no-active-run" });
    Ok(answer)
}

/// Aborts `run_id`, or every unfinished run of `session`, that the
/// connection may abort.
pub(super) async fn abort(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    session: &session_store_api::SessionKey,
    run_id: Option<&str>,
) -> Answer {
    if let Some(run_id) = run_id {
        trace::record_run(run_id);
    }
    let coordinator = &edge.backends.coordinator;
    let candidates: Vec<pb::RunSnapshot> = match run_id {
        Some(run_id) => {
            let got = coordinator
                .get(pb::GetRequest {
                    run_id: run_id.to_owned(),
                })
                .await
                .map_err(backend_error)?
                .snapshot;
            match got.filter(is_active) {
                None => return Ok(json!({ "ok": true, "aborted": false, "runIds": [] })),
                Some(run) if run.session_key != session.as_str() => {
                    return Err(fail(ErrorShape::invalid("runId does not match sessionKey")));
                }
                Some(run) => vec![run],
            }
        }
        None => {
            coordinator
                .list_active(pb::ListActiveRequest {
                    session_key: Some(session.as_str().to_owned()),
                })
                .await
                .map_err(backend_error)?
                .runs
        }
    };
    let mine: Vec<&pb::RunSnapshot> = candidates.iter().filter(|r| owns(conn, r)).collect();
    if mine.is_empty() && !candidates.is_empty() {
        return Err(fail(ErrorShape::invalid("unauthorized")));
    }
    let mut aborted = Vec::new();
    for run in mine {
        let cancelled = coordinator
            .cancel(pb::CancelRequest {
                target: Some(pb::cancel_request::Target::RunId(run.run_id.clone())),
                requester: conn.requester.clone(),
            })
            .await
            .map_err(backend_error)?;
        if cancelled
            .runs
            .iter()
            .any(|r| status_name(r.status) == "aborted")
        {
            aborted.push(run.run_id.clone());
        }
    }
    Ok(json!({ "ok": true, "aborted": !aborted.is_empty(), "runIds": aborted }))
}

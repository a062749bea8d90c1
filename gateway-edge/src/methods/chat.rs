//! `chat.send` and `chat.abort`.

use std::sync::Arc;

use run_coordinator_api::CoordinatorError;
use run_coordinator_api::model::{
    Admission, Attachment, CancelTarget, QueueMode as RunQueueMode, RunSnapshot, RunSpec,
    RunStatus, SubmitRequest, Submitted,
};
use serde_json::{Value, json};
use session_store_api::model::{EMPTY_SETTINGS, settings_digest};

use super::{Answer, Call, backend_error, fail, key_for, trace};
use crate::config::QueueMode;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::caches::TurnSettings;
use crate::state::connection::Conn;

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

pub(super) async fn chat_send(call: &Call<'_>) -> Answer {
    let (edge, p) = (call.edge, &call.params);
    let attachments = super::attachments::parse(edge, p)?;
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
        .map(run_queue_mode);
    // Checked before a slash command runs too: the params are the same
    // closed schema whatever the message says.
    let timeout_ms = p
        .integer("timeoutMs", 0, 48 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(0);
    if super::commands::interpreted(p)
        && let Some(command) = super::commands::parse(message).map_err(fail)?
    {
        return super::commands::run(call, &session, key, command).await;
    }
    start_turn(
        call,
        Turn {
            session: &session,
            run_id: key,
            message,
            queue_mode,
            timeout_ms,
            attachments,
        },
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
    pub queue_mode: Option<RunQueueMode>,
    pub timeout_ms: u64,
    pub attachments: Vec<Attachment>,
}

/// The coordinator's name for a queue mode.
pub(super) fn run_queue_mode(mode: QueueMode) -> RunQueueMode {
    match mode {
        QueueMode::Steer => RunQueueMode::Steer,
        QueueMode::Followup => RunQueueMode::Enqueue,
        QueueMode::Collect => RunQueueMode::Collect,
        QueueMode::Interrupt => RunQueueMode::Interrupt,
    }
}

/// How many times a send reads its session's settings again after the
/// store said they changed, before it gives up.
const SETTINGS_RETRIES: usize = 3;

/// Submits `turn` with the session's settings (its model, its queue mode):
/// the cached ones when this edge has them. The store admits the run only
/// with the settings it was made from (see `state/caches.rs`); when they
/// changed, they are read from the store and the turn is submitted again
/// with the same runId (nothing was admitted).
///
/// A session this edge knows nothing of is first taken for a new one: the
/// turn is made from the empty settings a new session has, and the
/// admission's own write creates the session if it has no row
/// (`create_session`). A new session is thus in the store before its first
/// send is answered, as the protocol's clients expect (`sessions.describe`
/// right after the ack), and that ACK waits for one durable commit and no
/// read: not for a read, a session write and then the run's. A session that
/// exists with empty settings is admitted the same way; one with settings
/// of its own refuses it as any settings change does, and is read.
async fn submit_with_settings(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    turn: &Turn<'_>,
) -> Result<Submitted, (ErrorShape, Option<Value>)> {
    let mut cached = edge.settings_cache.get(turn.session);
    let mut taken_for_new = cached.is_none();
    let mut attempts = 0;
    loop {
        let settings = match cached.take() {
            Some(settings) => settings,
            None if taken_for_new => super::session_settings::turn_settings_of(edge, None),
            None => super::session_settings::read_turn_settings(edge, turn.session).await?,
        };
        let create_session = settings.digest.is_none();
        let expected_settings = settings
            .digest
            .unwrap_or_else(|| settings_digest(EMPTY_SETTINGS));
        // What the cache keeps once the admission has created the session.
        let created = create_session.then(|| TurnSettings {
            options: settings.options.clone(),
            queue_mode: settings.queue_mode,
            digest: Some(expected_settings),
        });
        let submit = SubmitRequest {
            run_id: turn.run_id.to_owned(),
            session_key: turn.session.clone(),
            spec: RunSpec {
                kind: "chat".into(),
                message: turn.message.to_owned(),
                queue_mode: turn
                    .queue_mode
                    .unwrap_or(run_queue_mode(settings.queue_mode)),
                timeout_ms: (turn.timeout_ms > 0).then_some(turn.timeout_ms),
                options: settings.options,
                requester: conn.requester.clone(),
                label: None,
                attachments: turn.attachments.clone(),
            },
            expected_settings: Some(expected_settings),
            create_session,
        };
        // Same runId on every attempt: a retry after a failover is idempotent.
        match edge.backends.coordinator.submit(submit).await {
            Err(CoordinatorError::SettingsChanged(_)) if taken_for_new => {
                taken_for_new = false;
            }
            Err(CoordinatorError::SettingsChanged(_)) if attempts < SETTINGS_RETRIES => {
                edge.settings_cache.forget(turn.session);
                attempts += 1;
            }
            Ok(done) => {
                if let Some(created) = &created {
                    edge.settings_cache.put(turn.session, created);
                }
                return Ok(done);
            }
            Err(refused) => return Err(backend_error(refused)),
        }
    }
}

/// Submits a chat turn with the session's settings (its model) and answers
/// as `chat.send` does: `started`, `in_flight`, or the finished run's end.
pub(super) async fn start_turn(call: &Call<'_>, turn: Turn<'_>) -> Answer {
    let (edge, conn) = (call.edge, call.conn);
    let key = turn.run_id;
    // Awaited from before its Submit (see `FanIn::await_run`).
    let fanin = &call.events.fanin;
    fanin.await_run(key);
    let done = match submit_with_settings(edge, conn, &turn).await {
        Ok(done) => done,
        Err(refused) => {
            fanin.unawait_run(key);
            return Err(refused);
        }
    };
    let snapshot = done.snapshot;
    match done.admission {
        Admission::Accepted => {
            edge.metrics.acked("chat.send", call.received);
            Ok(json!({ "runId": key, "status": "started" }))
        }
        Admission::InFlight => Ok(json!({ "runId": key, "status": "in_flight" })),
        Admission::Completed => match snapshot.status {
            RunStatus::Ok => {
                fanin.unawait_run(key);
                Ok(json!({ "runId": key, "status": "ok" }))
            }
            other => {
                fanin.unawait_run(key);
                let other = other.as_str();
                let summary = snapshot
                    .outcome
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

fn owns(conn: &Conn, snapshot: &RunSnapshot) -> bool {
    conn.is_admin() || snapshot.requester.is_empty() || snapshot.requester == conn.requester
}

fn is_active(snapshot: &RunSnapshot) -> bool {
    !snapshot.status.is_terminal()
}

pub(super) const CHAT_ABORT_KEYS: &[&str] = &[
    "sessionKey",
    "runId",
    "agentId",
    "preserveSideRuns",
    "exemptRunId",
];

pub(super) async fn chat_abort(edge: &Arc<Edge>, conn: &Arc<Conn>, p: &Params<'_>) -> Answer {
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
pub(super) async fn sessions_abort(edge: &Arc<Edge>, conn: &Arc<Conn>, p: &Params<'_>) -> Answer {
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
    let candidates: Vec<RunSnapshot> = match run_id {
        Some(run_id) => {
            let got = coordinator.get(run_id).await.map_err(backend_error)?;
            match got.filter(is_active) {
                None => return Ok(json!({ "ok": true, "aborted": false, "runIds": [] })),
                Some(run) if run.session_key != session.as_str() => {
                    return Err(fail(ErrorShape::invalid("runId does not match sessionKey")));
                }
                Some(run) => vec![run],
            }
        }
        None => coordinator
            .list_active(Some(session))
            .await
            .map_err(backend_error)?,
    };
    let mine: Vec<&RunSnapshot> = candidates.iter().filter(|r| owns(conn, r)).collect();
    if mine.is_empty() && !candidates.is_empty() {
        return Err(fail(ErrorShape::invalid("unauthorized")));
    }
    let mut aborted = Vec::new();
    for run in mine {
        let cancelled = coordinator
            .cancel(CancelTarget::Run(run.run_id.clone()), &conn.requester)
            .await
            .map_err(backend_error)?;
        if cancelled.iter().any(|r| r.status == RunStatus::Aborted) {
            aborted.push(run.run_id.clone());
        }
    }
    Ok(json!({ "ok": true, "aborted": !aborted.is_empty(), "runIds": aborted }))
}

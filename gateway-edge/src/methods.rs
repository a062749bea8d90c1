//! Request dispatch and the served methods. Each request runs in its own
//! task, so answers leave in the order they finish; every method is a call
//! to the coordinator or the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_proto::run_coordinator::v1 as pb;
use serde_json::{Value, json};
use session_store::model::{HistoryCursor, HistoryQuery, ListQuery};
use session_store::store::now_ms;
use session_store::{SessionKey, SessionStore};
use tracing::Instrument;

use crate::conn::Conn;
use crate::edge::Edge;
use crate::fanout::{status_name, stop_reason_for};
use crate::frames::{self, ErrorShape, FrameError, Request, parse_request};
use crate::params::Params;
use crate::scopes::authorize;
use crate::trace;

/// Methods this edge serves (advertised in `hello-ok.features.methods`).
pub const SERVED_METHODS: &[&str] = &[
    "health",
    "status",
    "agents.list",
    "agent",
    "agent.wait",
    "chat.send",
    "chat.abort",
    "chat.history",
    "sessions.list",
    "sessions.reset",
    "sessions.delete",
    "sessions.subscribe",
    "sessions.unsubscribe",
    "runs.resume",
];

/// The params each served method accepts: the keys of its closed schema
/// (none for the methods that take no params and ignore what they get).
/// The handlers check against these lists, and the params property test
/// (`tests/params_fuzz.rs`) fails if a listed key is ever refused.
pub fn param_keys(method: &str) -> &'static [&'static str] {
    match method {
        "agent" => AGENT_KEYS,
        "agent.wait" => AGENT_WAIT_KEYS,
        "chat.send" => CHAT_SEND_KEYS,
        "chat.abort" => CHAT_ABORT_KEYS,
        "chat.history" => HISTORY_KEYS,
        "sessions.list" => SESSIONS_LIST_KEYS,
        "sessions.reset" => SESSIONS_RESET_KEYS,
        "sessions.delete" => SESSIONS_DELETE_KEYS,
        "runs.resume" => RUNS_RESUME_KEYS,
        _ => &[],
    }
}

const AGENT_WAIT_KEYS: &[&str] = &["runId", "timeoutMs"];
const CHAT_ABORT_KEYS: &[&str] = &[
    "sessionKey",
    "runId",
    "agentId",
    "preserveSideRuns",
    "exemptRunId",
];
const SESSIONS_RESET_KEYS: &[&str] = &["key", "reason"];
const SESSIONS_DELETE_KEYS: &[&str] = &["key", "deleteTranscript", "emitLifecycleHooks"];
pub const RUNS_RESUME_KEYS: &[&str] = &["runId", "fromSeq", "epoch"];

/// A method's answer: ok with a payload, or an error (with a payload for
/// the few methods that send both).
pub(crate) type Answer = Result<Value, (ErrorShape, Option<Value>)>;

pub(crate) fn fail(error: ErrorShape) -> (ErrorShape, Option<Value>) {
    (error, None)
}

/// Reads one text frame of an authenticated connection.
pub fn dispatch(edge: &Arc<Edge>, conn: &Arc<Conn>, text: &str) {
    let received = Instant::now();
    let request = match parse_request(text) {
        Ok(request) => request,
        // Unparsable JSON after the handshake is ignored.
        Err(FrameError::NotJson) => return,
        Err(FrameError::Invalid { id, reason }) => {
            let error = ErrorShape::invalid(format!("invalid request frame: {reason}"));
            let id = id.as_deref().unwrap_or("invalid");
            reply(edge, conn, id, "", Err(fail(error)));
            return;
        }
    };
    let refused = |error| reply(edge, conn, &request.id, &request.method, Err(fail(error)));
    if let Err(error) = authorize(&request.method, &conn.role, &conn.scopes) {
        refused(error);
        return;
    }
    if request.method == "connect" {
        refused(ErrorShape::invalid(
            "connect is only valid as the first request",
        ));
        return;
    }
    if !SERVED_METHODS.contains(&request.method.as_str()) {
        refused(ErrorShape::invalid(format!(
            "unknown method: {}",
            request.method
        )));
        return;
    }
    let (edge, conn) = (edge.clone(), conn.clone());
    let span = trace::request_span(&request);
    tokio::spawn(
        async move {
            let answer = handle(&edge, &conn, &request, received).await;
            reply(&edge, &conn, &request.id, &request.method, answer);
        }
        .instrument(span),
    );
}

/// Sends the (final) answer to a request and counts it.
fn reply(edge: &Edge, conn: &Conn, id: &str, method: &str, answer: Answer) {
    let frame = match answer {
        Ok(payload) => {
            edge.metrics.request(method, Ok(()));
            frames::ok_response(id, payload)
        }
        Err((error, payload)) => {
            edge.metrics.request(method, Err(error.code));
            trace::record_error(&error);
            frames::error_response(id, &error, payload)
        }
    };
    conn.outbox.send_frame(frame);
}

/// `received`: when the request frame arrived (for the ACK latency).
async fn handle(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    request: &Request,
    received: Instant,
) -> Answer {
    let params = &request.params;
    match request.method.as_str() {
        "health" => health(edge).await,
        "status" => status(edge).await,
        "agents.list" => Ok(json!({
            "defaultId": "main", "mainKey": "main", "scope": "per-sender",
            "agents": [{ "id": "main", "name": "main" }],
        })),
        "agent" => agent(edge, conn, request, received).await,
        "agent.wait" => agent_wait(edge, params).await,
        "chat.send" => chat_send(edge, conn, params, received).await,
        "chat.abort" => chat_abort(edge, conn, params).await,
        "chat.history" => chat_history(edge, params).await,
        "sessions.list" => sessions_list(edge, params).await,
        "sessions.reset" => sessions_reset(edge, params).await,
        "sessions.delete" => sessions_delete(edge, params).await,
        "sessions.subscribe" | "sessions.unsubscribe" => {
            let on = request.method == "sessions.subscribe";
            conn.sessions_subscribed
                .store(on, std::sync::atomic::Ordering::Relaxed);
            Ok(json!({ "subscribed": on }))
        }
        "runs.resume" => crate::resume::runs_resume(edge, conn, params).await,
        other => Err(fail(ErrorShape::invalid(format!(
            "unknown method: {other}"
        )))),
    }
}

/// A backend failure in the protocol's words.
pub(crate) fn backend_error(status: tonic::Status) -> (ErrorShape, Option<Value>) {
    use tonic::Code;
    let detail = clawgate_proto::status_detail::detail_of::<pb::CoordinatorErrorDetail>(
        &status,
        "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail",
    );
    let code = detail.as_ref().map(|d| d.code);
    let error = match status.code() {
        _ if code == Some(pb::ErrorCode::KeyReused as i32) => {
            ErrorShape::invalid("idempotencyKey was already used with a different request")
                .with_details(json!({
                    "code": "IDEMPOTENCY_KEY_REUSED",
                    "runId": detail.and_then(|d| d.run).map(|r| r.run_id),
                }))
        }
        Code::InvalidArgument => ErrorShape::invalid(status.message()),
        // A request over a backend's gRPC message limit (a deployment whose
        // limits disagree, docs/limits.md): the request is at fault.
        Code::ResourceExhausted | Code::OutOfRange => ErrorShape::invalid(format!(
            "the request is too large for the run coordinator: {}",
            status.message()
        )),
        Code::FailedPrecondition => ErrorShape::unavailable(status.message()),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            ErrorShape::unavailable(status.message()).retry_after(500)
        }
        _ => ErrorShape::unavailable(status.message()),
    };
    (error, None)
}

fn store_error(err: session_store::StoreError) -> (ErrorShape, Option<Value>) {
    let error = match err {
        session_store::StoreError::InvalidArgument(message) => ErrorShape::invalid(message),
        other => ErrorShape::unavailable(other.to_string()).retry_after(500),
    };
    (error, None)
}

fn key_for(method: &str, raw: &str) -> Result<SessionKey, (ErrorShape, Option<Value>)> {
    let key = SessionKey::parse(raw)
        .map_err(|e| fail(ErrorShape::invalid(format!("invalid {method} params: {e}"))))?;
    trace::record_session(key.as_str());
    Ok(key)
}

async fn health(edge: &Arc<Edge>) -> Answer {
    health_summary(edge).await.map_err(fail)
}

/// The `health` payload (also broadcast as the `health` event).
pub async fn health_summary(edge: &Arc<Edge>) -> Result<Value, ErrorShape> {
    let started = now_ms();
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: 5,
            ..ListQuery::default()
        })
        .await
        .map_err(|e| ErrorShape::unavailable(e.to_string()))?;
    let recent: Vec<Value> = sessions
        .iter()
        .map(|s| json!({ "key": s.key.as_str(), "updatedAt": s.updated_at_ms, "age": now_ms() - s.updated_at_ms }))
        .collect();
    Ok(json!({
        "ok": true, "ts": now_ms(), "durationMs": now_ms() - started,
        "channels": {}, "channelOrder": [], "channelLabels": {},
        "heartbeatSeconds": 0, "defaultAgentId": "main",
        "agents": [{ "agentId": "main", "isDefault": true }],
        "sessions": { "path": "session-store", "count": recent.len(), "recent": recent },
    }))
}

/// Broadcasts the `health` event to every connection that may read, every
/// `interval`, for as long as the edge runs.
pub async fn broadcast_health(edge: Arc<Edge>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Ok(summary) = health_summary(&edge).await {
            for conn in edge.connections().iter().filter(|c| c.can_read()) {
                conn.outbox.broadcast("health", &summary, false);
            }
        }
    }
}

async fn status(edge: &Arc<Edge>) -> Answer {
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .map_err(store_error)?;
    let recent: Vec<Value> = sessions
        .iter()
        .map(|s| json!({ "key": s.key.as_str(), "updatedAt": s.updated_at_ms, "sessionId": s.session_id.to_string() }))
        .collect();
    Ok(json!({
        "runtimeVersion": edge.version,
        "heartbeat": { "defaultAgentId": "main", "agents": [] },
        "channelSummary": [],
        "queuedSystemEvents": [],
        "sessions": {
            "paths": [], "count": recent.len(),
            "defaults": { "model": null, "contextTokens": null },
            "recent": recent, "byAgent": [],
        },
    }))
}

/// The terminal snapshot of a run, waiting as long as it takes (the caller
/// is an `agent` request waiting for its final response).
async fn until_terminal(edge: &Arc<Edge>, conn: &Conn, run_id: &str) -> Option<pb::RunSnapshot> {
    let mut coordinator = edge.backends.coordinator.clone();
    loop {
        let wait = coordinator.wait(pb::WaitRequest {
            run_id: run_id.to_owned(),
            timeout_ms: 60_000,
        });
        let waited = tokio::select! {
            waited = wait => waited,
            () = conn.outbox.closing.cancelled() => return None,
        };
        match waited {
            Ok(done) if done.get_ref().terminal => return done.into_inner().snapshot,
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn agent_final(snapshot: &pb::RunSnapshot) -> Answer {
    let status = status_name(snapshot.status);
    let stop_reason = stop_reason_for(status, snapshot.stop_reason.as_deref());
    match status {
        "ok" => Ok(json!({
            "runId": snapshot.run_id, "status": "ok", "summary": "completed",
            "result": {
                "payloads": [{ "text": snapshot.text }],
                "meta": frames::without_nulls(json!({
                    "durationMs": snapshot.ended_at_ms.zip(snapshot.started_at_ms).map(|(e, s)| e - s),
                    "stopReason": stop_reason,
                    "agentMeta": { "sessionId": snapshot.session_id, "sessionKey": snapshot.session_key },
                })),
            },
        })),
        "aborted" | "timeout" | "superseded" => Ok(json!({
            "runId": snapshot.run_id, "status": "timeout",
            "summary": if status == "aborted" { "aborted" } else { status },
            "stopReason": stop_reason,
        })),
        _ => {
            let message = snapshot
                .error
                .as_ref()
                .map_or_else(|| format!("run {status}"), |e| e.message.clone());
            Err((
                ErrorShape::unavailable(message.clone()),
                Some(json!({ "runId": snapshot.run_id, "status": "error", "summary": message })),
            ))
        }
    }
}

const AGENT_KEYS: &[&str] = &[
    "message",
    "idempotencyKey",
    "agentId",
    "sessionKey",
    "sessionId",
    "provider",
    "model",
    "to",
    "replyTo",
    "channel",
    "replyChannel",
    "accountId",
    "replyAccountId",
    "threadId",
    "groupId",
    "groupChannel",
    "groupSpace",
    "thinking",
    "deliver",
    "bestEffortDeliver",
    "attachments",
    "timeout",
    "lane",
    "extraSystemPrompt",
    "bootstrapContextMode",
    "bootstrapContextRunKind",
    "internalEvents",
    "inputProvenance",
    "label",
];

async fn agent(edge: &Arc<Edge>, conn: &Arc<Conn>, request: &Request, received: Instant) -> Answer {
    let p = Params::new("agent", &request.params, AGENT_KEYS).map_err(fail)?;
    let message = p.required_non_empty("message").map_err(fail)?;
    let key = p.required_non_empty("idempotencyKey").map_err(fail)?;
    trace::record_run(key);
    if let Some(agent_id) = p.optional_non_empty("agentId").map_err(fail)?
        && agent_id != "main"
    {
        return Err(fail(
            ErrorShape::invalid(format!("unknown agent id: {agent_id}"))
                .with_details(json!({ "code": "UNKNOWN_AGENT_ID", "agentId": agent_id })),
        ));
    }
    if (p.string("provider").map_err(fail)?.is_some() || p.string("model").map_err(fail)?.is_some())
        && !conn.is_admin()
    {
        return Err(fail(ErrorShape::invalid(
            "provider/model overrides are not authorized for this caller.",
        )));
    }
    let session = match p.optional_non_empty("sessionKey").map_err(fail)? {
        Some(raw) => key_for("agent", raw)?,
        None if p.string("agentId").map_err(fail)?.is_some() => key_for("agent", "main")?,
        None => key_for("agent", &format!("agent:main:explicit:{key}"))?,
    };
    let timeout_ms = p
        .integer("timeout", 0, 48 * 3600)
        .map_err(fail)?
        .map_or(0, |s| s * 1000);
    let submit = pb::SubmitRequest {
        run_id: key.to_owned(),
        session_key: session.as_str().to_owned(),
        kind: "agent".into(),
        message: message.to_owned(),
        queue_mode: pb::QueueMode::Enqueue as i32,
        timeout_ms,
        options_json: String::new(),
        requester: conn.requester.clone(),
        label: p.string("label").map_err(fail)?.map(str::to_owned),
    };
    let mut coordinator = edge.backends.coordinator.clone();
    let done = coordinator
        .submit(submit)
        .await
        .map_err(backend_error)?
        .into_inner();
    let snapshot = done.snapshot.unwrap_or_default();
    if done.admission == pb::Admission::Completed as i32 {
        return agent_final(&snapshot);
    }
    // First response: accepted. The final one follows on the same id.
    if done.admission == pb::Admission::Accepted as i32 {
        edge.metrics.acked("agent", received);
    }
    conn.outbox.send_frame(frames::ok_response(
        &request.id,
        json!({
            "runId": key, "sessionKey": session.as_str(), "agentId": "main",
            "status": "accepted", "acceptedAt": done.accepted_at_ms,
        }),
    ));
    match until_terminal(edge, conn, key).await {
        Some(done) => agent_final(&done),
        // The connection went away; the run goes on without it.
        None => Ok(Value::Null),
    }
}

async fn agent_wait(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("agent.wait", params, AGENT_WAIT_KEYS).map_err(fail)?;
    let run_id = p.required_non_empty("runId").map_err(fail)?;
    trace::record_run(run_id);
    let timeout_ms = p
        .integer("timeoutMs", 0, 24 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(30_000);
    let mut coordinator = edge.backends.coordinator.clone();
    let waited = coordinator
        .wait(pb::WaitRequest {
            run_id: run_id.to_owned(),
            timeout_ms: timeout_ms.max(1),
        })
        .await
        .map_err(backend_error)?
        .into_inner();
    let Some(snapshot) = waited.snapshot.filter(|_| waited.terminal) else {
        return Ok(json!({ "runId": run_id, "status": "timeout" }));
    };
    let status = status_name(snapshot.status);
    let stop_reason = stop_reason_for(status, snapshot.stop_reason.as_deref());
    Ok(frames::without_nulls(match status {
        "ok" => json!({
            "runId": run_id, "status": "ok", "startedAt": snapshot.started_at_ms,
            "endedAt": snapshot.ended_at_ms, "stopReason": stop_reason,
        }),
        "timeout" => json!({
            "runId": run_id, "status": "timeout", "startedAt": snapshot.started_at_ms,
            "endedAt": snapshot.ended_at_ms, "stopReason": stop_reason,
        }),
        "aborted" => json!({
            "runId": run_id, "status": "error", "endedAt": snapshot.ended_at_ms,
            "error": "aborted", "stopReason": stop_reason,
        }),
        _ => json!({
            "runId": run_id, "status": "error", "startedAt": snapshot.started_at_ms,
            "endedAt": snapshot.ended_at_ms,
            "error": snapshot.error.as_ref().map_or_else(|| status.to_owned(), |e| e.message.clone()),
            "stopReason": stop_reason,
        }),
    }))
}

const CHAT_SEND_KEYS: &[&str] = &[
    "sessionKey",
    "message",
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
];

async fn chat_send(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    params: &Value,
    received: Instant,
) -> Answer {
    let p = Params::new("chat.send", params, CHAT_SEND_KEYS).map_err(fail)?;
    let raw_key = p.required_non_empty("sessionKey").map_err(fail)?;
    let message = p.required_string("message").map_err(fail)?;
    let key = p.required_non_empty("idempotencyKey").map_err(fail)?;
    trace::record_run(key);
    if message.contains('\0') {
        return Err(fail(ErrorShape::invalid(
            "message must not contain null bytes",
        )));
    }
    if message.trim().is_empty() {
        return Err(fail(ErrorShape::invalid("message or attachment required")));
    }
    let session = key_for("chat.send", raw_key)?;
    let queue_mode = match p.string("queueMode").map_err(fail)? {
        Some("interrupt") => pb::QueueMode::Interrupt,
        _ => pb::QueueMode::Enqueue,
    };
    let timeout_ms = p
        .integer("timeoutMs", 0, 48 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(0);
    let mut coordinator = edge.backends.coordinator.clone();
    let done = coordinator
        .submit(pb::SubmitRequest {
            run_id: key.to_owned(),
            session_key: session.as_str().to_owned(),
            kind: "chat".into(),
            message: message.to_owned(),
            queue_mode: queue_mode as i32,
            timeout_ms,
            options_json: String::new(),
            requester: conn.requester.clone(),
            label: None,
        })
        .await
        .map_err(backend_error)?
        .into_inner();
    let snapshot = done.snapshot.unwrap_or_default();
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

async fn chat_abort(edge: &Arc<Edge>, conn: &Arc<Conn>, params: &Value) -> Answer {
    let p = Params::new("chat.abort", params, CHAT_ABORT_KEYS).map_err(fail)?;
    let session = key_for(
        "chat.abort",
        p.required_non_empty("sessionKey").map_err(fail)?,
    )?;
    let run_id = p.optional_non_empty("runId").map_err(fail)?;
    if let Some(run_id) = run_id {
        trace::record_run(run_id);
    }
    let mut coordinator = edge.backends.coordinator.clone();
    let candidates: Vec<pb::RunSnapshot> = match run_id {
        Some(run_id) => {
            let got = coordinator
                .get(pb::GetRequest {
                    run_id: run_id.to_owned(),
                })
                .await
                .map_err(backend_error)?
                .into_inner()
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
                .into_inner()
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
            .map_err(backend_error)?
            .into_inner();
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

const HISTORY_KEYS: &[&str] = &[
    "sessionKey",
    "limit",
    "maxChars",
    "agentId",
    "offset",
    "messageId",
    "sessionId",
    "cursor",
];

async fn chat_history(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("chat.history", params, HISTORY_KEYS).map_err(fail)?;
    let raw_key = p.required_non_empty("sessionKey").map_err(fail)?;
    let key = key_for("chat.history", raw_key)?;
    let limit = p.integer("limit", 1, 1000).map_err(fail)?.unwrap_or(200) as u32;
    let max_chars = p
        .integer("maxChars", 1, 500_000)
        .map_err(fail)?
        .map(|n| n as u32);
    let session_id = match p.optional_non_empty("sessionId").map_err(fail)? {
        Some(id) => Some(id.parse().map_err(|_| {
            fail(ErrorShape::invalid(
                "invalid chat.history params: /sessionId must be a UUID",
            ))
        })?),
        None => None,
    };
    let page = edge
        .backends
        .store
        .history(HistoryQuery {
            key,
            limit,
            cursor: HistoryCursor::Latest,
            max_chars,
            session_id,
        })
        .await
        .map_err(store_error)?;
    let id = page.session_id.map(|id| id.to_string());
    let messages: Vec<Value> = page
        .entries
        .iter()
        .map(|e| {
            let content: Value = serde_json::from_str(&e.content_json).unwrap_or_else(|_| json!(e.content_json));
            let usage = e.metadata.usage_json.as_deref().and_then(|u| serde_json::from_str::<Value>(u).ok());
            frames::without_nulls(json!({
                "role": e.role, "content": content, "timestamp": e.timestamp_ms,
                "stopReason": e.metadata.stop_reason, "usage": usage,
                "aborted": e.metadata.aborted.then_some(true),
                "__openclaw": { "id": format!("{}:{}", id.as_deref().unwrap_or(""), e.seq), "seq": e.seq, "runId": e.run_id },
            }))
        })
        .collect();
    Ok(frames::without_nulls(json!({
        "sessionKey": raw_key, "sessionId": id, "messages": messages,
        "hasMore": page.has_more, "totalMessages": page.total,
    })))
}

fn session_row(s: &session_store::model::Session) -> Value {
    use session_store::model::RunStatus as S;
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

const SESSIONS_LIST_KEYS: &[&str] = &[
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

async fn sessions_list(edge: &Arc<Edge>, params: &Value) -> Answer {
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

async fn sessions_reset(edge: &Arc<Edge>, params: &Value) -> Answer {
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

async fn sessions_delete(edge: &Arc<Edge>, params: &Value) -> Answer {
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

//! `agent` (accepted, then the final result under the same id),
//! `agent.wait` and `agents.list`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_proto::run_coordinator::v1 as pb;
use serde_json::{Value, json};

use super::{Answer, backend_error, fail, key_for};
use crate::conn::Conn;
use crate::edge::Edge;
use crate::fanout::{status_name, stop_reason_for};
use crate::frames::{self, ErrorShape, Request};
use crate::params::Params;
use crate::trace;

/// The terminal snapshot of a run, waiting as long as it takes (the caller
/// is an `agent` request waiting for its final response).
async fn until_terminal(edge: &Arc<Edge>, conn: &Conn, run_id: &str) -> Option<pb::RunSnapshot> {
    let coordinator = &edge.backends.coordinator;
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
            Ok(done) if done.terminal => return done.snapshot,
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

pub(super) const AGENT_KEYS: &[&str] = &[
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

pub(super) async fn agent(
    edge: &Arc<Edge>,
    conn: &Arc<Conn>,
    request: &Request,
    received: Instant,
) -> Answer {
    let p = Params::new("agent", &request.params, AGENT_KEYS).map_err(fail)?;
    let attachments = super::attachments::parse(edge, "agent", &request.params)?;
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
        attachments,
        // `agent` runs without the session's settings.
        expected_settings_digest: None,
    };
    let coordinator = &edge.backends.coordinator;
    // Awaited from before its Submit (see `Edge::await_run`).
    edge.await_run(key);
    let done = match coordinator.submit(submit).await {
        Ok(done) => done,
        Err(status) => {
            edge.unawait_run(key);
            return Err(backend_error(status));
        }
    };
    let snapshot = done.snapshot.unwrap_or_default();
    if done.admission == pb::Admission::Completed as i32 {
        edge.unawait_run(key);
        return agent_final(&snapshot);
    }
    // The key's run is still being admitted or running: one answer, as the
    // protocol gives a duplicate, and no final on this request (the
    // original request gets it).
    if done.admission == pb::Admission::InFlight as i32 {
        return Ok(json!({
            "runId": key, "status": "in_flight", "sessionKey": session.as_str(), "agentId": "main",
        }));
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

/// Admitted and waiting for its turn in the session's lane.
fn is_queued(snapshot: &pb::RunSnapshot) -> bool {
    matches!(status_name(snapshot.status), "accepted" | "queued") && snapshot.queue_position > 0
}

pub(super) const AGENT_WAIT_KEYS: &[&str] = &["runId", "timeoutMs"];

pub(super) async fn agent_wait(edge: &Arc<Edge>, params: &Value) -> Answer {
    let p = Params::new("agent.wait", params, AGENT_WAIT_KEYS).map_err(fail)?;
    let run_id = p.required_non_empty("runId").map_err(fail)?;
    trace::record_run(run_id);
    let timeout_ms = p
        .integer("timeoutMs", 0, 24 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(30_000);
    let coordinator = &edge.backends.coordinator;
    // A run still queued behind another turn is answered at once, as the
    // protocol does: waiting would only spend the caller's timeout.
    let current = coordinator
        .get(pb::GetRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(backend_error)?
        .snapshot;
    if current.as_ref().is_some_and(is_queued) {
        return Ok(json!({
            "runId": run_id, "status": "pending", "timeoutPhase": "queue", "providerStarted": false,
        }));
    }
    let waited = coordinator
        .wait(pb::WaitRequest {
            run_id: run_id.to_owned(),
            timeout_ms: timeout_ms.max(1),
        })
        .await
        .map_err(backend_error)?;
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

/// The one agent, with the model its runs use (clients gate sending on
/// the agent having one).
pub(super) async fn agents_list(edge: &Arc<Edge>) -> Answer {
    let catalog = super::catalog::runtime_catalog(edge).await?;
    let mut agent = json!({ "id": "main", "name": "main" });
    if let Some(primary) = super::catalog::default_model_ref(&catalog) {
        agent["model"] = json!({ "primary": primary });
    }
    Ok(json!({
        "defaultId": "main", "mainKey": "main", "scope": "per-sender",
        "agents": [agent],
    }))
}

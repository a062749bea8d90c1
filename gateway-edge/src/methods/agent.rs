//! `agent` (accepted, then the final result under the same id),
//! `agent.wait` and `agents.list`.

use std::sync::Arc;
use std::time::Duration;

use run_coordinator_api::model::{
    Admission, QueueMode, RunSnapshot, RunSpec, RunStatus, SubmitRequest,
};
use serde_json::{Value, json};

use super::{Answer, Call, backend_error, fail, key_for, trace};
use crate::events::translate::stop_reason_for;
use crate::protocol::frames::{self, ErrorShape};
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::connection::Conn;

/// The terminal snapshot of a run, waiting as long as it takes (the caller
/// is an `agent` request waiting for its final response).
async fn until_terminal(edge: &Arc<Edge>, conn: &Conn, run_id: &str) -> Option<RunSnapshot> {
    let coordinator = &edge.backends.coordinator;
    loop {
        let wait = coordinator.wait(run_id, 60_000);
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

fn agent_final(snapshot: &RunSnapshot) -> Answer {
    let status = snapshot.status.as_str();
    let outcome = &snapshot.outcome;
    let stop_reason = stop_reason_for(status, outcome.stop_reason.as_deref());
    match status {
        "ok" => Ok(json!({
            "runId": snapshot.run_id, "status": "ok", "summary": "completed",
            "result": {
                "payloads": [{ "text": outcome.text }],
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
            let message = outcome
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

pub(super) async fn agent(call: &Call<'_>) -> Answer {
    let (edge, conn, p) = (call.edge, call.conn, &call.params);
    let attachments = super::attachments::parse(edge, p)?;
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
    let submit = SubmitRequest {
        run_id: key.to_owned(),
        session_key: session.clone(),
        spec: RunSpec {
            kind: "agent".into(),
            message: message.to_owned(),
            queue_mode: QueueMode::Enqueue,
            timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
            options: json!({}),
            requester: conn.requester.clone(),
            label: p.string("label").map_err(fail)?.map(str::to_owned),
            attachments,
        },
        // `agent` runs without the session's settings.
        expected_settings: None,
        create_session: false,
    };
    let coordinator = &edge.backends.coordinator;
    // Awaited from before its Submit (see `FanIn::await_run`).
    let fanin = &call.events.fanin;
    fanin.await_run(key);
    let done = match coordinator.submit(submit).await {
        Ok(done) => done,
        Err(status) => {
            fanin.unawait_run(key);
            return Err(backend_error(status));
        }
    };
    let snapshot = done.snapshot;
    if done.admission == Admission::Completed {
        fanin.unawait_run(key);
        return agent_final(&snapshot);
    }
    // The key's run is still being admitted or running: one answer, as the
    // protocol gives a duplicate, and no final on this request (the
    // original request gets it).
    if done.admission == Admission::InFlight {
        return Ok(json!({
            "runId": key, "status": "in_flight", "sessionKey": session.as_str(), "agentId": "main",
        }));
    }
    // First response: accepted. The final one follows on the same id.
    if done.admission == Admission::Accepted {
        edge.metrics.acked("agent", call.received);
    }
    conn.outbox.send_frame(frames::ok_response(
        &call.request.id,
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
fn is_queued(snapshot: &RunSnapshot) -> bool {
    matches!(snapshot.status, RunStatus::Accepted | RunStatus::Queued)
        && snapshot.queue_position > 0
}

pub(super) const AGENT_WAIT_KEYS: &[&str] = &["runId", "timeoutMs"];

pub(super) async fn agent_wait(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    let run_id = p.required_non_empty("runId").map_err(fail)?;
    trace::record_run(run_id);
    let timeout_ms = p
        .integer("timeoutMs", 0, 24 * 3600 * 1000)
        .map_err(fail)?
        .unwrap_or(30_000);
    let coordinator = &edge.backends.coordinator;
    // A run still queued behind another turn is answered at once, as the
    // protocol does: waiting would only spend the caller's timeout.
    let current = coordinator.get(run_id).await.map_err(backend_error)?;
    if current.as_ref().is_some_and(is_queued) {
        return Ok(json!({
            "runId": run_id, "status": "pending", "timeoutPhase": "queue", "providerStarted": false,
        }));
    }
    let waited = coordinator
        .wait(run_id, timeout_ms.max(1))
        .await
        .map_err(backend_error)?;
    let Some(snapshot) = waited.snapshot.filter(|_| waited.terminal) else {
        return Ok(json!({ "runId": run_id, "status": "timeout" }));
    };
    let status = snapshot.status.as_str();
    let stop_reason = stop_reason_for(status, snapshot.outcome.stop_reason.as_deref());
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
            "error": snapshot.outcome.error.as_ref().map_or_else(|| status.to_owned(), |e| e.message.clone()),
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

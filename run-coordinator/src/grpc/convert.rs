//! Protobuf ↔ domain conversions for the coordinator's gRPC face.

use clawgate_proto::run_coordinator::v1 as pb;
use session_store_api::SessionKey;
use session_store_api::grpc::convert::status_to_pb;

use crate::error::CoordinatorError;
use crate::events::{EventBody, LifecyclePhase, RunEvent, ToolPhase};
use crate::model::*;

fn status(status: RunStatus) -> i32 {
    status_to_pb(Some(status)) as i32
}

fn error_to_pb(error: RunErrorInfo) -> pb::RunError {
    pb::RunError {
        kind: error.kind,
        message: error.message,
    }
}

pub fn snapshot_to_pb(s: RunSnapshot) -> pb::RunSnapshot {
    pb::RunSnapshot {
        run_id: s.run_id,
        session_key: s.session_key,
        kind: s.kind,
        status: status(s.status),
        queue_position: s.queue_position,
        last_seq: s.last_seq,
        created_at_ms: s.created_at_ms,
        started_at_ms: s.started_at_ms,
        ended_at_ms: s.ended_at_ms,
        usage_json: s
            .outcome
            .usage
            .as_ref()
            .and_then(|u| serde_json::to_string(u).ok()),
        text: s.outcome.text,
        stop_reason: s.outcome.stop_reason,
        error: s.outcome.error.map(error_to_pb),
        superseded_by: s.outcome.superseded_by,
        session_id: s.session_id,
        fence_token: s.fence_token,
        epoch: s.epoch,
        requester: s.requester,
    }
}

pub fn submit_from_pb(r: pb::SubmitRequest) -> Result<SubmitRequest, CoordinatorError> {
    let queue_mode = match pb::QueueMode::try_from(r.queue_mode) {
        Ok(pb::QueueMode::Unspecified | pb::QueueMode::Enqueue) => QueueMode::Enqueue,
        Ok(pb::QueueMode::Interrupt) => QueueMode::Interrupt,
        Ok(pb::QueueMode::Reject) => QueueMode::Reject,
        Ok(pb::QueueMode::Steer) => QueueMode::Steer,
        Ok(pb::QueueMode::Collect) => QueueMode::Collect,
        Err(_) => {
            return Err(CoordinatorError::invalid(format!(
                "unknown queue mode {}",
                r.queue_mode
            )));
        }
    };
    let options = if r.options_json.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&r.options_json).map_err(|e| {
            CoordinatorError::invalid(format!("options_json is not valid JSON: {e}"))
        })?
    };
    Ok(SubmitRequest {
        session_key: SessionKey::parse(&r.session_key)?,
        spec: RunSpec {
            kind: if r.kind.is_empty() {
                "agent".into()
            } else {
                r.kind
            },
            message: r.message,
            queue_mode,
            timeout_ms: (r.timeout_ms > 0).then_some(r.timeout_ms),
            options,
            requester: r.requester,
            label: r.label,
            attachments: r
                .attachments
                .into_iter()
                .map(|a| {
                    use base64::Engine as _;
                    Attachment {
                        mime_type: a.mime_type,
                        file_name: a.file_name,
                        data: base64::engine::general_purpose::STANDARD.encode(a.data),
                    }
                })
                .collect(),
        },
        run_id: r.run_id,
        expected_settings: r.expected_settings_digest,
    })
}

pub fn event_to_pb(event: &RunEvent) -> pb::RunEvent {
    use pb::run_event::Body;
    let body = match &event.body {
        EventBody::Lifecycle {
            phase,
            status: terminal,
            stop_reason,
            error,
        } => Body::Lifecycle(pb::Lifecycle {
            phase: match phase {
                LifecyclePhase::Start => pb::lifecycle::Phase::Start,
                LifecyclePhase::End => pb::lifecycle::Phase::End,
                LifecyclePhase::Error => pb::lifecycle::Phase::Error,
            } as i32,
            status: terminal.map_or(0, status),
            stop_reason: stop_reason.clone(),
            error: error.clone().map(error_to_pb),
        }),
        EventBody::Assistant { text, delta } => Body::Assistant(pb::Assistant {
            text: text.clone(),
            delta: delta.clone(),
        }),
        EventBody::Tool {
            phase,
            tool_call_id,
            name,
            data_json,
            is_error,
        } => Body::Tool(pb::Tool {
            phase: match phase {
                ToolPhase::Start => pb::tool::Phase::Start,
                ToolPhase::Update => pb::tool::Phase::Update,
                ToolPhase::Result => pb::tool::Phase::Result,
            } as i32,
            tool_call_id: tool_call_id.clone(),
            name: name.clone(),
            data_json: data_json.clone(),
            is_error: *is_error,
        }),
        EventBody::Status {
            status: current,
            queue_position,
        } => Body::Status(pb::StatusChange {
            status: status(*current),
            queue_position: *queue_position,
        }),
    };
    pb::RunEvent {
        run_id: event.run_id.clone(),
        session_key: event.session_key.clone(),
        seq: event.seq,
        stream_seq: event.stream_seq,
        epoch: event.epoch.to_string(),
        ts_ms: event.ts_ms,
        body: Some(body),
    }
}

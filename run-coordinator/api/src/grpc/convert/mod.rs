//! Protobuf ↔ domain, both ways: the coordinator's server reads requests
//! and writes answers with these, the client writes requests and reads
//! answers with the same, so a value crosses the wire and comes back equal.

use base64::Engine as _;
use clawgate_proto::agent_runtime::v1 as runtime_pb;
use clawgate_proto::run_coordinator::v1 as pb;
use session_store_api::SessionKey;
use session_store_api::grpc::convert::{status_from_pb, status_to_pb};

use crate::error::CoordinatorError;
use crate::events::{EventBody, LifecyclePhase, RunEvent, StreamItem, StreamReset, ToolPhase};
use crate::model::*;

type Decoded<T> = Result<T, CoordinatorError>;

fn status(status: RunStatus) -> i32 {
    status_to_pb(Some(status)) as i32
}

/// A status a coordinator sent: `None` for unspecified.
fn optional_status_from(raw: i32) -> Decoded<Option<RunStatus>> {
    status_from_pb(raw).map_err(|e| CoordinatorError::Internal(e.to_string()))
}

fn status_from(raw: i32) -> Decoded<RunStatus> {
    optional_status_from(raw)?
        .ok_or_else(|| CoordinatorError::Internal("a run snapshot without a status".into()))
}

fn error_to_pb(error: RunErrorInfo) -> pb::RunError {
    pb::RunError {
        kind: error.kind,
        message: error.message,
    }
}

fn error_from_pb(error: pb::RunError) -> RunErrorInfo {
    RunErrorInfo {
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

pub fn snapshot_from_pb(s: pb::RunSnapshot) -> Decoded<RunSnapshot> {
    Ok(RunSnapshot {
        status: status_from(s.status)?,
        run_id: s.run_id,
        session_key: s.session_key,
        kind: s.kind,
        queue_position: s.queue_position,
        last_seq: s.last_seq,
        created_at_ms: s.created_at_ms,
        started_at_ms: s.started_at_ms,
        ended_at_ms: s.ended_at_ms,
        outcome: Outcome {
            text: s.text,
            stop_reason: s.stop_reason,
            error: s.error.map(error_from_pb),
            superseded_by: s.superseded_by,
            usage: s
                .usage_json
                .as_deref()
                .and_then(|u| serde_json::from_str(u).ok()),
        },
        session_id: s.session_id,
        fence_token: s.fence_token,
        epoch: s.epoch,
        requester: s.requester,
    })
}

pub fn snapshots_from_pb(runs: Vec<pb::RunSnapshot>) -> Decoded<Vec<RunSnapshot>> {
    runs.into_iter().map(snapshot_from_pb).collect()
}

fn queue_mode_to_pb(mode: QueueMode) -> pb::QueueMode {
    match mode {
        QueueMode::Enqueue => pb::QueueMode::Enqueue,
        QueueMode::Interrupt => pb::QueueMode::Interrupt,
        QueueMode::Reject => pb::QueueMode::Reject,
        QueueMode::Steer => pb::QueueMode::Steer,
        QueueMode::Collect => pb::QueueMode::Collect,
    }
}

fn queue_mode_from_pb(raw: i32) -> Decoded<QueueMode> {
    match pb::QueueMode::try_from(raw) {
        Ok(pb::QueueMode::Unspecified | pb::QueueMode::Enqueue) => Ok(QueueMode::Enqueue),
        Ok(pb::QueueMode::Interrupt) => Ok(QueueMode::Interrupt),
        Ok(pb::QueueMode::Reject) => Ok(QueueMode::Reject),
        Ok(pb::QueueMode::Steer) => Ok(QueueMode::Steer),
        Ok(pb::QueueMode::Collect) => Ok(QueueMode::Collect),
        Err(_) => Err(CoordinatorError::invalid(format!(
            "unknown queue mode {raw}"
        ))),
    }
}

/// A submit's attachments go over the wire as bytes; the domain keeps them
/// in base64 (the run record's JSON).
fn attachment_to_pb(a: Attachment) -> Decoded<runtime_pb::Attachment> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(&a.data)
        .map_err(|e| {
            CoordinatorError::invalid(format!("attachment {:?} is not base64: {e}", a.file_name))
        })?;
    Ok(runtime_pb::Attachment {
        mime_type: a.mime_type,
        file_name: a.file_name,
        data,
    })
}

fn attachment_from_pb(a: runtime_pb::Attachment) -> Attachment {
    Attachment {
        mime_type: a.mime_type,
        file_name: a.file_name,
        data: base64::engine::general_purpose::STANDARD.encode(a.data),
    }
}

pub fn submit_to_pb(r: SubmitRequest) -> Decoded<pb::SubmitRequest> {
    let spec = r.spec;
    Ok(pb::SubmitRequest {
        run_id: r.run_id,
        session_key: r.session_key.as_str().to_owned(),
        kind: spec.kind,
        message: spec.message,
        queue_mode: queue_mode_to_pb(spec.queue_mode) as i32,
        timeout_ms: spec.timeout_ms.unwrap_or(0),
        options_json: match &spec.options {
            serde_json::Value::Object(o) if o.is_empty() => String::new(),
            options => options.to_string(),
        },
        requester: spec.requester,
        label: spec.label,
        attachments: spec
            .attachments
            .into_iter()
            .map(attachment_to_pb)
            .collect::<Decoded<_>>()?,
        expected_settings_digest: r.expected_settings,
        create_session: r.create_session,
    })
}

pub fn submit_from_pb(r: pb::SubmitRequest) -> Decoded<SubmitRequest> {
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
            queue_mode: queue_mode_from_pb(r.queue_mode)?,
            timeout_ms: (r.timeout_ms > 0).then_some(r.timeout_ms),
            options,
            requester: r.requester,
            label: r.label,
            attachments: r.attachments.into_iter().map(attachment_from_pb).collect(),
        },
        run_id: r.run_id,
        expected_settings: r.expected_settings_digest,
        create_session: r.create_session,
    })
}

pub fn submitted_to_pb(s: Submitted) -> pb::SubmitResponse {
    pb::SubmitResponse {
        admission: match s.admission {
            Admission::Accepted => pb::Admission::Accepted,
            Admission::InFlight => pb::Admission::InFlight,
            Admission::Completed => pb::Admission::Completed,
        } as i32,
        snapshot: Some(snapshot_to_pb(s.snapshot)),
        accepted_at_ms: s.accepted_at_ms,
    }
}

pub fn submitted_from_pb(s: pb::SubmitResponse) -> Decoded<Submitted> {
    let admission = match pb::Admission::try_from(s.admission) {
        Ok(pb::Admission::Accepted) => Admission::Accepted,
        Ok(pb::Admission::InFlight) => Admission::InFlight,
        Ok(pb::Admission::Completed) => Admission::Completed,
        _ => {
            return Err(CoordinatorError::Internal(format!(
                "unknown admission {}",
                s.admission
            )));
        }
    };
    let snapshot = s
        .snapshot
        .ok_or_else(|| CoordinatorError::Internal("a submit answer without its run".into()))?;
    Ok(Submitted {
        admission,
        snapshot: snapshot_from_pb(snapshot)?,
        accepted_at_ms: s.accepted_at_ms,
    })
}

pub fn wait_to_pb(w: WaitResult) -> pb::WaitResponse {
    pb::WaitResponse {
        terminal: w.terminal,
        unknown: w.unknown,
        snapshot: w.snapshot.map(snapshot_to_pb),
    }
}

pub fn wait_from_pb(w: pb::WaitResponse) -> Decoded<WaitResult> {
    Ok(WaitResult {
        terminal: w.terminal,
        unknown: w.unknown,
        snapshot: w.snapshot.map(snapshot_from_pb).transpose()?,
    })
}

pub fn cancel_target_to_pb(target: CancelTarget) -> pb::cancel_request::Target {
    match target {
        CancelTarget::Run(run_id) => pb::cancel_request::Target::RunId(run_id),
        CancelTarget::Session(key) => {
            pb::cancel_request::Target::SessionKey(key.as_str().to_owned())
        }
    }
}

pub fn cancel_target_from_pb(target: Option<pb::cancel_request::Target>) -> Decoded<CancelTarget> {
    match target {
        Some(pb::cancel_request::Target::RunId(run_id)) => Ok(CancelTarget::Run(run_id)),
        Some(pb::cancel_request::Target::SessionKey(key)) => {
            Ok(CancelTarget::Session(SessionKey::parse(&key)?))
        }
        None => Err(CoordinatorError::invalid(
            "cancel needs a run_id or a session_key",
        )),
    }
}

pub fn model_to_pb(m: ModelInfo) -> runtime_pb::Model {
    runtime_pb::Model {
        id: m.id,
        name: m.name,
        provider: m.provider,
        context_window: m.context_window.unwrap_or(0),
        reasoning: m.reasoning,
        input: m.input,
    }
}

pub fn model_from_pb(m: runtime_pb::Model) -> ModelInfo {
    ModelInfo {
        id: m.id,
        name: m.name,
        provider: m.provider,
        context_window: (m.context_window > 0).then_some(m.context_window),
        reasoning: m.reasoning,
        input: m.input,
    }
}

pub fn runtime_to_pb(info: RuntimeInfo) -> pb::DescribeRuntimeResponse {
    pb::DescribeRuntimeResponse {
        runtime: info.name,
        models: info.catalog.models.into_iter().map(model_to_pb).collect(),
        default_model: info.catalog.default_model.unwrap_or_default(),
    }
}

pub fn runtime_from_pb(r: pb::DescribeRuntimeResponse) -> RuntimeInfo {
    RuntimeInfo {
        name: r.runtime,
        catalog: ModelCatalog {
            models: r.models.into_iter().map(model_from_pb).collect(),
            default_model: Some(r.default_model).filter(|m| !m.is_empty()),
        },
    }
}

pub fn lanes_to_pb(stats: LaneStats) -> pb::DescribeLanesResponse {
    pb::DescribeLanesResponse {
        max_executing: stats.max_executing,
        executing: stats.executing,
        waiting: stats.waiting,
        draining: stats.draining,
        lanes: stats.lanes,
        lanes_running: stats.lanes_running,
        lanes_waiting: stats.lanes_waiting,
    }
}

pub fn lanes_from_pb(r: pb::DescribeLanesResponse) -> LaneStats {
    LaneStats {
        max_executing: r.max_executing,
        executing: r.executing,
        waiting: r.waiting,
        draining: r.draining,
        lanes: r.lanes,
        lanes_running: r.lanes_running,
        lanes_waiting: r.lanes_waiting,
    }
}

fn lifecycle_phase_to_pb(phase: LifecyclePhase) -> pb::lifecycle::Phase {
    match phase {
        LifecyclePhase::Start => pb::lifecycle::Phase::Start,
        LifecyclePhase::End => pb::lifecycle::Phase::End,
        LifecyclePhase::Error => pb::lifecycle::Phase::Error,
    }
}

fn tool_phase_to_pb(phase: ToolPhase) -> pb::tool::Phase {
    match phase {
        ToolPhase::Start => pb::tool::Phase::Start,
        ToolPhase::Update => pb::tool::Phase::Update,
        ToolPhase::Result => pb::tool::Phase::Result,
    }
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
            phase: lifecycle_phase_to_pb(*phase) as i32,
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
            phase: tool_phase_to_pb(*phase) as i32,
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

pub fn event_from_pb(event: pb::RunEvent) -> Decoded<RunEvent> {
    use pb::run_event::Body;
    let unknown = |what: &str| CoordinatorError::Internal(format!("an event with {what}"));
    let body = match event.body.ok_or_else(|| unknown("no body"))? {
        Body::Lifecycle(life) => EventBody::Lifecycle {
            phase: match pb::lifecycle::Phase::try_from(life.phase) {
                Ok(pb::lifecycle::Phase::Start) => LifecyclePhase::Start,
                Ok(pb::lifecycle::Phase::End) => LifecyclePhase::End,
                Ok(pb::lifecycle::Phase::Error) => LifecyclePhase::Error,
                _ => return Err(unknown("an unknown lifecycle phase")),
            },
            status: optional_status_from(life.status)?,
            stop_reason: life.stop_reason,
            error: life.error.map(error_from_pb),
        },
        Body::Assistant(a) => EventBody::Assistant {
            text: a.text,
            delta: a.delta,
        },
        Body::Tool(tool) => EventBody::Tool {
            phase: match pb::tool::Phase::try_from(tool.phase) {
                Ok(pb::tool::Phase::Start) => ToolPhase::Start,
                Ok(pb::tool::Phase::Update) => ToolPhase::Update,
                Ok(pb::tool::Phase::Result) => ToolPhase::Result,
                _ => return Err(unknown("an unknown tool phase")),
            },
            tool_call_id: tool.tool_call_id,
            name: tool.name,
            data_json: tool.data_json,
            is_error: tool.is_error,
        },
        Body::Status(change) => EventBody::Status {
            status: status_from(change.status)?,
            queue_position: change.queue_position,
        },
    };
    Ok(RunEvent {
        run_id: event.run_id,
        session_key: event.session_key,
        seq: event.seq,
        stream_seq: event.stream_seq,
        epoch: event.epoch.into(),
        ts_ms: event.ts_ms,
        body,
    })
}

pub fn stream_item_to_pb(item: &StreamItem) -> pb::SubscribeResponse {
    use pb::subscribe_response::Item;
    let item = match item {
        StreamItem::Subscribed { epoch } => Item::Subscribed(pb::Subscribed {
            epoch: epoch.clone(),
        }),
        StreamItem::Event(event) => Item::Event(event_to_pb(event)),
        StreamItem::Reset(reset) => Item::Reset(pb::StreamReset {
            reason: reset.reason.clone(),
            epoch: reset.epoch.to_string(),
        }),
    };
    pb::SubscribeResponse { item: Some(item) }
}

/// `None`: an item this client does not know (a newer coordinator's).
pub fn stream_item_from_pb(item: pb::SubscribeResponse) -> Decoded<Option<StreamItem>> {
    use pb::subscribe_response::Item;
    Ok(match item.item {
        Some(Item::Subscribed(s)) => Some(StreamItem::Subscribed { epoch: s.epoch }),
        Some(Item::Event(event)) => Some(StreamItem::Event(event_from_pb(event)?)),
        Some(Item::Reset(reset)) => Some(StreamItem::Reset(StreamReset {
            reason: reset.reason,
            epoch: reset.epoch.into(),
        })),
        None => None,
    })
}

#[cfg(test)]
mod tests;

//! The contract's messages to and from the runtime types.

use clawgate_proto::agent_runtime::v1 as pb;
use run_coordinator_api::grpc::convert::{model_from_pb, model_to_pb};
use tonic::Status;

use crate::runtime::{
    Attachment, ErrorKind, HistoryMessage, Inputs, ModelCatalog, RuntimeError, RuntimeEvent,
    RuntimeRequest, Usage,
};

pub(super) fn catalog_from_pb(response: pb::ListModelsResponse) -> ModelCatalog {
    ModelCatalog {
        models: response.models.into_iter().map(model_from_pb).collect(),
        default_model: Some(response.default_model).filter(|m| !m.is_empty()),
    }
}

/// A catalog in the contract's words.
pub fn catalog_to_pb(catalog: ModelCatalog) -> pb::ListModelsResponse {
    pb::ListModelsResponse {
        models: catalog.models.into_iter().map(model_to_pb).collect(),
        default_model: catalog.default_model.unwrap_or_default(),
    }
}

pub(super) fn request_to_pb(request: RuntimeRequest) -> pb::ExecuteRequest {
    let options_json = if request.options.is_null() {
        "{}".to_owned()
    } else {
        request.options.to_string()
    };
    pb::ExecuteRequest {
        run_id: request.run_id,
        session_key: request.session_key,
        session_id: request.session_id,
        message: request.message,
        history: request
            .history
            .into_iter()
            .map(|m| pb::HistoryMessage {
                role: m.role,
                content_json: m.content_json,
            })
            .collect(),
        options_json,
        deadline_ms: request.deadline_ms.unwrap_or(0),
        attachments: request
            .attachments
            .into_iter()
            .map(|a| pb::Attachment {
                mime_type: a.mime_type,
                file_name: a.file_name,
                data: a.data,
            })
            .collect(),
    }
}

/// The request of an execution, with the inputs steered into it.
pub(super) fn request_from_pb(
    request: pb::ExecuteRequest,
    inputs: Inputs,
) -> Result<RuntimeRequest, Status> {
    if request.run_id.is_empty() {
        return Err(Status::invalid_argument("run_id is required"));
    }
    let options = if request.options_json.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&request.options_json)
            .map_err(|e| Status::invalid_argument(format!("options_json is not JSON: {e}")))?
    };
    Ok(RuntimeRequest {
        run_id: request.run_id,
        session_key: request.session_key,
        session_id: request.session_id,
        message: request.message,
        history: request
            .history
            .into_iter()
            .map(|m| HistoryMessage {
                role: m.role,
                content_json: m.content_json,
            })
            .collect(),
        options,
        deadline_ms: (request.deadline_ms != 0).then_some(request.deadline_ms),
        inputs,
        attachments: request
            .attachments
            .into_iter()
            .map(|a| Attachment {
                mime_type: a.mime_type,
                file_name: a.file_name,
                data: a.data,
            })
            .collect(),
    })
}

/// `None` for an event this side does not know (a newer contract).
pub(super) fn event_from_pb(event: pb::RuntimeEvent) -> Option<Result<RuntimeEvent, RuntimeError>> {
    use pb::runtime_event::Event;
    Some(Ok(match event.event? {
        Event::AssistantDelta(d) => RuntimeEvent::AssistantDelta(d.text),
        Event::ToolStart(t) => RuntimeEvent::ToolStart {
            tool_call_id: t.tool_call_id,
            name: t.name,
            arguments_json: t.arguments_json,
        },
        Event::ToolUpdate(t) => RuntimeEvent::ToolUpdate {
            tool_call_id: t.tool_call_id,
            partial_json: t.partial_json,
        },
        Event::ToolResult(t) => RuntimeEvent::ToolResult {
            tool_call_id: t.tool_call_id,
            result_json: t.result_json,
            is_error: t.is_error,
        },
        Event::Usage(u) => RuntimeEvent::Usage(Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            total_tokens: u.total_tokens,
        }),
        Event::Finished(f) => RuntimeEvent::Finished {
            stop_reason: f.stop_reason,
        },
        Event::InputTaken(t) => RuntimeEvent::InputTaken { id: t.input_id },
        Event::Failed(f) => {
            let kind = kind_from_pb(f.kind());
            return Some(Err(RuntimeError::new(kind, f.message, f.retryable)));
        }
    }))
}

pub(super) fn event_to_pb(event: RuntimeEvent) -> pb::RuntimeEvent {
    use pb::runtime_event::Event;
    let event = match event {
        RuntimeEvent::AssistantDelta(text) => Event::AssistantDelta(pb::AssistantDelta { text }),
        RuntimeEvent::InputTaken { id } => Event::InputTaken(pb::InputTaken { input_id: id }),
        RuntimeEvent::ToolStart {
            tool_call_id,
            name,
            arguments_json,
        } => Event::ToolStart(pb::ToolStart {
            tool_call_id,
            name,
            arguments_json,
        }),
        RuntimeEvent::ToolUpdate {
            tool_call_id,
            partial_json,
        } => Event::ToolUpdate(pb::ToolUpdate {
            tool_call_id,
            partial_json,
        }),
        RuntimeEvent::ToolResult {
            tool_call_id,
            result_json,
            is_error,
        } => Event::ToolResult(pb::ToolResult {
            tool_call_id,
            result_json,
            is_error,
        }),
        RuntimeEvent::Usage(u) => Event::Usage(pb::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            total_tokens: u.total_tokens,
        }),
        RuntimeEvent::Finished { stop_reason } => Event::Finished(pb::Finished { stop_reason }),
    };
    pb::RuntimeEvent { event: Some(event) }
}

pub(super) fn failed_to_pb(error: RuntimeError) -> pb::RuntimeEvent {
    pb::RuntimeEvent {
        event: Some(pb::runtime_event::Event::Failed(pb::Failed {
            kind: kind_to_pb(error.kind) as i32,
            message: error.message,
            retryable: error.retryable,
        })),
    }
}

pub(super) fn kind_from_pb(kind: pb::ErrorKind) -> ErrorKind {
    match kind {
        pb::ErrorKind::RateLimit => ErrorKind::RateLimit,
        pb::ErrorKind::ContextLength => ErrorKind::ContextLength,
        pb::ErrorKind::Timeout => ErrorKind::Timeout,
        pb::ErrorKind::Refusal => ErrorKind::Refusal,
        pb::ErrorKind::Unknown | pb::ErrorKind::Unspecified => ErrorKind::Unknown,
    }
}

pub(super) fn kind_to_pb(kind: ErrorKind) -> pb::ErrorKind {
    match kind {
        ErrorKind::RateLimit => pb::ErrorKind::RateLimit,
        ErrorKind::ContextLength => pb::ErrorKind::ContextLength,
        ErrorKind::Timeout => pb::ErrorKind::Timeout,
        ErrorKind::Refusal => pb::ErrorKind::Refusal,
        ErrorKind::Unknown => pb::ErrorKind::Unknown,
    }
}

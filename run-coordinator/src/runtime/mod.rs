//! Agent runtimes: what actually executes a run. One trait, three
//! implementations (echo, OpenAI-compatible, external gRPC); cancellation
//! reaches every one of them through the `CancellationToken`.

pub mod echo;
pub mod grpc;
pub mod openai;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use run_coordinator_api::model::{ModelCatalog, ModelInfo, Usage};
use tokio_util::sync::CancellationToken;

/// One earlier turn of the session, as stored in the transcript.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryMessage {
    pub role: String,
    /// JSON array of content parts.
    pub content_json: String,
}

#[derive(Debug, Clone)]
pub struct RuntimeRequest {
    pub run_id: String,
    pub session_key: String,
    pub session_id: String,
    /// The user's message for this turn.
    pub message: String,
    /// Earlier turns, oldest first.
    pub history: Vec<HistoryMessage>,
    /// Runtime-specific options (a JSON object; `{}` when none).
    pub options: serde_json::Value,
    /// The run's deadline, Unix milliseconds. The coordinator enforces it.
    pub deadline_ms: Option<i64>,
    /// Messages steered into this run while it runs (queue mode `steer`).
    pub inputs: Inputs,
    /// Files sent with the message, in order.
    pub attachments: Vec<Attachment>,
}

/// A file sent with the turn's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// `type/subtype`, e.g. `image/png`.
    pub mime_type: String,
    pub file_name: String,
    pub data: Vec<u8>,
}

/// A message steered into a running run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerInput {
    /// The steering run's id: what `RuntimeEvent::InputTaken` names.
    pub id: String,
    pub message: String,
}

/// The messages steered into one run, for its runtime to take at its next
/// model boundary (after a reply or a tool result, before the next model
/// call). A runtime that takes one emits `RuntimeEvent::InputTaken` before
/// anything that answers it; one it never takes becomes the session's next
/// turn instead, so a runtime that ignores steering loses nothing.
#[derive(Clone, Default)]
pub struct Inputs {
    inner: Arc<InputsInner>,
}

#[derive(Default)]
struct InputsInner {
    queue: Mutex<InputQueue>,
    arrived: tokio::sync::Notify,
}

#[derive(Default)]
struct InputQueue {
    items: VecDeque<SteerInput>,
    closed: bool,
}

impl fmt::Debug for Inputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.inner.queue.lock().unwrap();
        f.debug_struct("Inputs")
            .field("pending", &queue.items.len())
            .field("closed", &queue.closed)
            .finish()
    }
}

impl Inputs {
    /// Offers `input` to the run; `false` once the run takes no more.
    pub fn push(&self, input: SteerInput) -> bool {
        let mut queue = self.inner.queue.lock().unwrap();
        if queue.closed {
            return false;
        }
        queue.items.push_back(input);
        drop(queue);
        self.inner.arrived.notify_waiters();
        true
    }

    /// The oldest input not yet taken.
    pub fn try_take(&self) -> Option<SteerInput> {
        self.inner.queue.lock().unwrap().items.pop_front()
    }

    /// Waits until an input is there or the run takes no more; `false` then.
    pub async fn wait(&self) -> bool {
        loop {
            let arrived = self.inner.arrived.notified();
            {
                let queue = self.inner.queue.lock().unwrap();
                if !queue.items.is_empty() {
                    return true;
                }
                if queue.closed {
                    return false;
                }
            }
            arrived.await;
        }
    }

    /// Takes no more inputs.
    pub fn close(&self) {
        self.inner.queue.lock().unwrap().closed = true;
        self.inner.arrived.notify_waiters();
    }
}

/// What a runtime reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEvent {
    /// More assistant text (a delta, not the text so far).
    AssistantDelta(String),
    ToolStart {
        tool_call_id: String,
        name: String,
        arguments_json: String,
    },
    ToolUpdate {
        tool_call_id: String,
        partial_json: String,
    },
    ToolResult {
        tool_call_id: String,
        result_json: String,
        is_error: bool,
    },
    Usage(Usage),
    /// The runtime took the steered input `id` (`Inputs::try_take`): what
    /// follows answers it.
    InputTaken {
        id: String,
    },
    /// The turn is over. A stream that ends without it means "stop".
    Finished {
        stop_reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    RateLimit,
    ContextLength,
    Timeout,
    Refusal,
    Unknown,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::ContextLength => "context_length",
            Self::Timeout => "timeout",
            Self::Refusal => "refusal",
            Self::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeError {
    pub kind: ErrorKind,
    pub message: String,
    /// Whether the same request may succeed when tried again.
    pub retryable: bool,
}

impl RuntimeError {
    pub fn new(kind: ErrorKind, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            kind,
            message: message.into(),
            retryable,
        }
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.as_str())
    }
}

impl std::error::Error for RuntimeError {}

/// The events of one execution; an `Err` item ends the run as failed.
pub type RuntimeStream = BoxStream<'static, Result<RuntimeEvent, RuntimeError>>;

#[async_trait]
pub trait AgentRuntime: Send + Sync + 'static {
    /// A short name for logs and snapshots ("echo", "openai", "grpc").
    fn name(&self) -> &'static str;

    /// Starts one execution. When `cancel` fires the runtime should stop
    /// soon; the coordinator stops reading the stream at once either way,
    /// so a runtime that ignores cancellation cannot change the outcome.
    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError>;

    /// The models it offers; none by name unless the runtime says.
    async fn models(&self) -> Result<ModelCatalog, RuntimeError> {
        Ok(ModelCatalog::default())
    }
}

//! A run's events as the coordinator streams them: lifecycle, assistant
//! text, tool calls and status changes, each numbered in its run (`seq`)
//! and in its coordinator's all-runs stream (`stream_seq`, within `epoch`),
//! and what a subscription delivers.

use std::sync::Arc;

use crate::model::{RunErrorInfo, RunStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecyclePhase {
    Start,
    End,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolPhase {
    Start,
    Update,
    Result,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventBody {
    Lifecycle {
        phase: LifecyclePhase,
        /// The terminal status, for End and Error.
        status: Option<RunStatus>,
        stop_reason: Option<String>,
        error: Option<RunErrorInfo>,
    },
    Assistant {
        /// The text so far.
        text: String,
        delta: String,
    },
    Tool {
        phase: ToolPhase,
        tool_call_id: String,
        name: String,
        data_json: String,
        is_error: bool,
    },
    Status {
        status: RunStatus,
        queue_position: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEvent {
    pub run_id: String,
    pub session_key: String,
    pub seq: u64,
    pub stream_seq: u64,
    pub epoch: Arc<str>,
    pub ts_ms: i64,
    pub body: EventBody,
}

/// Why a subscription cannot be served from the requested position; the
/// client reloads state from history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamReset {
    pub reason: String,
    pub epoch: Arc<str>,
}

/// What a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// The subscription is open, in the coordinator's `epoch`; events follow.
    Subscribed {
        epoch: String,
    },
    Event(RunEvent),
    /// The position asked for cannot be served: reload state, resubscribe.
    Reset(StreamReset),
}

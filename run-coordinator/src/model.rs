//! Domain types of the coordinator (no tonic or prost types here).

use serde::{Deserialize, Serialize};
use session_store_api::SessionKey;
pub use session_store_api::model::RunStatus;

use crate::runtime::Usage;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// Wait for the session's earlier runs, in arrival order.
    #[default]
    Enqueue,
    /// Supersede the session's active run and start now.
    Interrupt,
    /// Refuse when the session has a run active or queued.
    Reject,
    /// Into the session's running run, at its next model boundary; a turn
    /// of its own when none runs (or the runtime never takes it).
    Steer,
    /// Queued runs of this mode waiting together fold into one turn.
    Collect,
}

/// A request to run, as admitted. Stored (as JSON) in the run record so a
/// queued run can be started again after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub queue_mode: QueueMode,
    /// Execution timeout; `None`: the coordinator's default.
    pub timeout_ms: Option<u64>,
    /// Runtime options (a JSON object).
    #[serde(default = "empty_object")]
    pub options: serde_json::Value,
    #[serde(default)]
    pub requester: String,
    #[serde(default)]
    pub label: Option<String>,
    /// Files sent with the message (images, documents), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// A file sent with a run's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `type/subtype`, e.g. `image/png`.
    pub mime_type: String,
    #[serde(default)]
    pub file_name: String,
    /// The bytes, base64 (standard alphabet, padded).
    pub data: String,
}

impl Attachment {
    pub fn is_image(&self) -> bool {
        self.mime_type.starts_with("image/")
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub run_id: String,
    pub session_key: SessionKey,
    pub spec: RunSpec,
    /// The digest of the session settings the spec was made from: admitted
    /// only if they are still the session's (`NewRun::expected_settings`).
    /// Not part of the fingerprint.
    pub expected_settings: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Accepted,
    InFlight,
    Completed,
}

#[derive(Debug, Clone)]
pub struct Submitted {
    pub admission: Admission,
    pub snapshot: RunSnapshot,
    pub accepted_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunErrorInfo {
    pub kind: String,
    pub message: String,
}

/// How a run ended, as persisted in the record's `outcome_json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunErrorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// What the coordinator tells about a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSnapshot {
    pub run_id: String,
    pub session_key: String,
    pub kind: String,
    pub status: RunStatus,
    /// Runs ahead of this one in its session's lane.
    pub queue_position: u32,
    pub last_seq: u64,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub outcome: Outcome,
    pub session_id: Option<String>,
    pub fence_token: Option<u64>,
    pub epoch: String,
    pub requester: String,
}

#[derive(Debug, Clone)]
pub struct WaitResult {
    pub terminal: bool,
    pub unknown: bool,
    pub snapshot: Option<RunSnapshot>,
}

#[derive(Debug, Clone)]
pub enum CancelTarget {
    Run(String),
    Session(SessionKey),
}

//! Domain types of the coordinator (no tonic or prost types here).

pub use clawgate_common::RunStatus;
use serde::{Deserialize, Serialize};
use session_store_api::SessionKey;

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

impl RunSpec {
    /// A run of `kind` (`agent`, `chat`) for `message`, every other field
    /// at its default: queued behind the session's earlier runs, the
    /// coordinator's timeout, no options, no requester, no label, no files.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            queue_mode: QueueMode::default(),
            timeout_ms: None,
            options: empty_object(),
            requester: String::new(),
            label: None,
            attachments: Vec::new(),
        }
    }
}

/// A run to admit: `run_id` is its idempotency key (a Submit repeated with
/// it never runs twice).
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub run_id: String,
    pub session_key: SessionKey,
    pub spec: RunSpec,
    /// The digest of the session settings the spec was made from: admitted
    /// only if they are still the session's (`NewRun::expected_settings`).
    /// Not part of the fingerprint.
    pub expected_settings: Option<u64>,
    /// `true`: a session with no row in the store is created by the
    /// admission's own write (`NewRun::create_session`). Not part of the
    /// fingerprint.
    pub create_session: bool,
}

impl SubmitRequest {
    /// `spec` to run in `session_key` under the idempotency key `run_id`,
    /// whatever the session's settings are now.
    pub fn new(run_id: impl Into<String>, session_key: SessionKey, spec: RunSpec) -> Self {
        Self {
            run_id: run_id.into(),
            session_key,
            spec,
            expected_settings: None,
            create_session: false,
        }
    }
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

/// The tokens a run's model calls used, as its runtime reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

/// A model a runtime offers (what `models.list` shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    pub id: String,
    /// Display name (the id when empty).
    pub name: String,
    pub provider: String,
    pub context_window: Option<u64>,
    pub reasoning: bool,
    /// Input kinds it takes: "text", "image".
    pub input: Vec<String>,
}

/// The models a runtime offers, and the one a run without a choice uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelCatalog {
    pub models: Vec<ModelInfo>,
    pub default_model: Option<String>,
}

/// What a coordinator says of the runtime it executes runs through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// A short name ("echo", "openai", "grpc").
    pub name: String,
    pub catalog: ModelCatalog,
}

/// A coordinator's global cap and session lanes at one moment; summed over
/// coordinators, the cluster's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// The global cap, and the runs holding a slot of it.
    pub max_executing: u32,
    pub executing: u32,
    /// Runs admitted and waiting to start.
    pub waiting: u32,
    /// Stopping: nothing more starts there.
    pub draining: bool,
    /// Session lanes with work; those with a run executing; those with runs
    /// waiting.
    pub lanes: u32,
    pub lanes_running: u32,
    pub lanes_waiting: u32,
}

impl std::ops::Add for LaneStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            max_executing: self.max_executing + other.max_executing,
            executing: self.executing + other.executing,
            waiting: self.waiting + other.waiting,
            draining: self.draining || other.draining,
            lanes: self.lanes + other.lanes,
            lanes_running: self.lanes_running + other.lanes_running,
            lanes_waiting: self.lanes_waiting + other.lanes_waiting,
        }
    }
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

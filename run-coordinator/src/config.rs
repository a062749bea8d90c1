//! The coordinator's settings. Flags and environment variables (`COORDINATOR_*`)
//! map onto these in `cli.rs`; documented in docs/run-coordinator.md.

use std::time::Duration;

use clawgate_common::limits;

use crate::events::HubLimits;
use crate::ownership::OwnershipConfig;

#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Runs executing at once, across all sessions.
    pub max_executing: usize,
    /// Execution timeout of a run that asks for none.
    pub default_run_timeout: Duration,
    /// The largest timeout a run may ask for.
    pub max_run_timeout: Duration,
    /// How long a finished run stays in the in-memory dedupe cache.
    pub dedupe_ttl: Duration,
    /// Most finished runs in the dedupe cache (active runs are never evicted).
    pub dedupe_capacity: usize,
    /// Assistant deltas are coalesced to at most one event per this interval.
    pub delta_interval: Duration,
    pub events: HubLimits,
    /// Earlier transcript entries handed to the runtime.
    pub history_entries: u32,
    /// Largest user message, bytes.
    pub max_message_bytes: usize,
    /// Largest runtime options object, bytes.
    pub max_options_bytes: usize,
    /// Most attachment bytes (decoded) of one run, all together.
    pub max_attachment_bytes: usize,
    /// Most attachments of one run.
    pub max_attachments: usize,
    /// Longest run label, characters.
    pub max_label_chars: usize,
    /// Longest requester, characters.
    pub max_requester_chars: usize,
    /// How long a Cancel waits for a running run to record its terminal.
    pub cancel_settle: Duration,
    /// Wait timeout when the caller gives none.
    pub default_wait: Duration,
    /// The longest Wait.
    pub max_wait: Duration,
    /// Most runs admitted and not yet started (`queue.rs`).
    pub max_queued_runs: usize,
    /// Most bytes (messages, attachments, options) of those runs together.
    pub max_queued_bytes: usize,
    /// How this instance comes to own the partitions it serves.
    pub ownership: OwnershipConfig,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            max_executing: 16,
            default_run_timeout: Duration::from_secs(600),
            max_run_timeout: Duration::from_secs(48 * 3600),
            dedupe_ttl: Duration::from_secs(300),
            dedupe_capacity: 1000,
            delta_interval: Duration::from_millis(150),
            events: HubLimits::default(),
            history_entries: 50,
            max_message_bytes: limits::RUN_MAX_MESSAGE_BYTES,
            max_options_bytes: limits::RUN_MAX_OPTIONS_BYTES,
            max_attachment_bytes: limits::RUN_MAX_ATTACHMENT_BYTES,
            max_attachments: limits::RUN_MAX_ATTACHMENTS,
            max_label_chars: limits::RUN_MAX_LABEL_CHARS,
            max_requester_chars: limits::RUN_MAX_REQUESTER_CHARS,
            cancel_settle: Duration::from_secs(10),
            default_wait: Duration::from_secs(30),
            max_wait: Duration::from_secs(3600),
            max_queued_runs: 10_000,
            max_queued_bytes: 512 * 1024 * 1024,
            ownership: OwnershipConfig::default(),
        }
    }
}

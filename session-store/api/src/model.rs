//! Domain types of the session store (no tonic or prost types here).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::invalid::Invalid;
use crate::key::SessionKey;

/// Sessions and runs are identified by their `sessionId` UUID and `runId` string.
pub type SessionId = Uuid;

pub const MAX_RUN_ID_CHARS: usize = 256;

/// Checks a runId (= idempotency key): 1..=256 characters, no control characters.
pub fn validate_run_id(run_id: &str) -> Result<(), Invalid> {
    if run_id.is_empty() {
        return Err(Invalid::new("runId must not be empty"));
    }
    if run_id.chars().count() > MAX_RUN_ID_CHARS {
        return Err(Invalid::new(format!(
            "runId is longer than {MAX_RUN_ID_CHARS} characters"
        )));
    }
    if run_id.chars().any(char::is_control) {
        return Err(Invalid::new("runId must not contain control characters"));
    }
    Ok(())
}

/// Parses a sessionId sent by a caller.
pub fn parse_session_id(raw: &str) -> Result<SessionId, Invalid> {
    Uuid::parse_str(raw).map_err(|_| {
        // Quotes the start only: the input may be megabytes.
        let mut shown: String = raw.chars().take(40).collect();
        if shown.len() < raw.len() {
            shown.push('…');
        }
        Invalid::new(format!("sessionId {shown:?} is not a UUID"))
    })
}

/// What the store tells about a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub key: SessionKey,
    pub session_id: SessionId,
    pub active_writer_run_id: Option<String>,
    /// The last fence token issued for this key (0 when none ever was).
    pub fence_token: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub label: Option<String>,
    pub last_run_id: Option<String>,
    pub last_run_status: Option<RunStatus>,
    pub entry_count: u64,
    /// The client-visible session preferences: a JSON object, `"{}"` when
    /// none. Opaque to the store (its clients define the keys); changed only
    /// by `patch_session`.
    pub settings_json: String,
}

/// The settings of a session that has none.
pub const EMPTY_SETTINGS: &str = "{}";

/// The special settings key that is the session's `label` (the column
/// `ListQuery::search` matches), never kept inside the settings.
pub const LABEL_SETTING: &str = "label";

/// PatchSession: merges `patch_json` into the session's settings.
#[derive(Debug, Clone)]
pub struct PatchSession {
    pub key: SessionKey,
    /// A JSON object, merged at the top level (JSON merge patch, one level
    /// deep): a key with `null` is removed, any other value replaces the
    /// key's. `"label"`: a string sets the session's label, `null` clears it.
    pub patch_json: String,
    /// Create the session when the key has none (else the patch is refused).
    pub create: bool,
}

#[derive(Debug, Clone)]
pub struct PatchOutcome {
    pub session: Session,
    /// The patch created the session.
    pub created: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcquireMode {
    /// Both expectations must hold.
    #[default]
    Cas,
    /// Replace whatever run holds the slot; the sessionId expectation still holds.
    Takeover,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedSession {
    /// Whatever sessionId the key has now; a session is created if it has none.
    Current,
    Id(SessionId),
}

#[derive(Debug, Clone)]
pub struct AcquireWriter {
    pub key: SessionKey,
    pub expected_session: ExpectedSession,
    /// `None`: the slot must be free.
    pub expected_writer: Option<String>,
    pub run_id: String,
    pub mode: AcquireMode,
    /// Stored when this call creates the session.
    pub label: Option<String>,
    /// The coordinator's ownership of the session's partition; `None` only
    /// for a partition nobody has ever owned.
    pub owner_token: Option<OwnerToken>,
}

#[derive(Debug, Clone)]
pub struct Acquired {
    pub fence_token: u64,
    pub session: Session,
    pub superseded_run_id: Option<String>,
    pub session_created: bool,
}

#[derive(Debug, Clone)]
pub struct Released {
    pub released: bool,
    pub session: Option<Session>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_json: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub aborted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub role: String,
    /// JSON array of content parts.
    pub content_json: String,
    /// `None`: the store's clock.
    pub timestamp_ms: Option<i64>,
    pub metadata: EntryMetadata,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    pub seq: u64,
    pub role: String,
    pub content_json: String,
    pub timestamp_ms: i64,
    pub run_id: String,
    #[serde(default)]
    pub metadata: EntryMetadata,
}

#[derive(Debug, Clone)]
pub struct AppendEntries {
    pub key: SessionKey,
    pub session_id: SessionId,
    pub run_id: String,
    pub fence_token: u64,
    pub entries: Vec<NewEntry>,
    /// The coordinator's ownership of the session's partition; `None` only
    /// for a partition nobody has ever owned.
    pub owner_token: Option<OwnerToken>,
}

#[derive(Debug, Clone)]
pub struct Appended {
    pub first_seq: u64,
    pub last_seq: u64,
    pub session: Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryCursor {
    /// The newest entries.
    Latest,
    /// Entries with seq < n, newest first up to the limit.
    Before(u64),
    /// Entries with seq > n, oldest first up to the limit.
    After(u64),
}

#[derive(Debug, Clone)]
pub struct HistoryQuery {
    pub key: SessionKey,
    pub limit: u32,
    pub cursor: HistoryCursor,
    pub max_chars: Option<u32>,
    /// Read this transcript (e.g. one a reset replaced) instead of the
    /// key's current one.
    pub session_id: Option<SessionId>,
}

#[derive(Debug, Clone, Default)]
pub struct HistoryPage {
    /// `None` when the key has no session.
    pub session_id: Option<SessionId>,
    /// Ascending seq.
    pub entries: Vec<TranscriptEntry>,
    pub has_more: bool,
    pub total: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub limit: u32,
    /// Only sessions updated at or after this instant.
    pub updated_since_ms: Option<i64>,
    /// Case-insensitive substring of key or label.
    pub search: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ResetOutcome {
    pub session: Session,
    pub previous_session_id: Option<SessionId>,
    pub superseded_run_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct DeleteOutcome {
    pub deleted: bool,
    pub previous_session_id: Option<SessionId>,
    pub superseded_run_id: Option<String>,
}

/// A run's status: shared with the coordinator, which reports it.
pub use clawgate_common::run::RunStatus;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub session_key: String,
    pub kind: String,
    pub fingerprint: String,
    pub status: RunStatus,
    pub version: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub owner: String,
    pub request_json: String,
    pub outcome_json: Option<String>,
    pub session_id: Option<SessionId>,
    pub fence_token: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub session_key: SessionKey,
    pub kind: String,
    pub fingerprint: String,
    /// `Accepted` or `Queued`.
    pub status: RunStatus,
    pub owner: String,
    pub request_json: String,
    /// The coordinator's ownership of the session's partition; `None` only
    /// for a partition nobody has ever owned.
    pub owner_token: Option<OwnerToken>,
    /// `Some`: the run was made from the session's settings with this
    /// [`settings_digest`], read before; the record is created only if the
    /// session exists with those settings still, else `SettingsChanged`.
    /// An existing record is returned whatever the settings.
    pub expected_settings: Option<u64>,
    /// `true`: a session with no row is created in the same write, with
    /// [`EMPTY_SETTINGS`], before `expected_settings` is checked (a new
    /// session's first run is one commit, and the session exists once the
    /// run does). A session that has a row is left as it is.
    pub create_session: bool,
}

/// A digest of a session's `settings_json` (64-bit FNV-1a of its bytes):
/// what a caller that read the settings passes to CreateRun as
/// `expected_settings`. Written out, not `std`'s hasher, so that every
/// build of every service computes the same value.
pub fn settings_digest(settings_json: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    settings_json.bytes().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

#[derive(Debug, Clone)]
pub struct CreateRunOutcome {
    pub created: bool,
    pub record: RunRecord,
    pub fingerprint_mismatch: bool,
}

#[derive(Debug, Clone)]
pub struct RunUpdate {
    pub run_id: String,
    pub expected_version: u64,
    pub status: RunStatus,
    pub owner: Option<String>,
    pub outcome_json: Option<String>,
    pub session_id: Option<SessionId>,
    pub fence_token: Option<u64>,
    /// The coordinator's ownership of the session's partition; `None` only
    /// for a partition nobody has ever owned.
    pub owner_token: Option<OwnerToken>,
}

/// StartRun: the start of a run as one durable unit. The run's record goes
/// to `running` under `owner` (a CAS on `expected_version`), the run takes
/// its session's writer slot (an AcquireWriter on the current sessionId; the
/// session is created if the key has none) and `entries` (its user turn) are
/// appended under the new fence. All of it commits, or none of it; a refusal
/// is the refusal the single call would give (`RunTerminal`,
/// `RunVersionConflict`, `WriterConflict`, `StaleOwner`, ...).
#[derive(Debug, Clone)]
pub struct StartRun {
    pub run_id: String,
    /// The run's session; must be its record's.
    pub key: SessionKey,
    pub expected_version: u64,
    /// The executing instance (the record's new owner).
    pub owner: String,
    pub mode: AcquireMode,
    /// As `AcquireWriter::expected_writer` (`None`: the slot must be free).
    pub expected_writer: Option<String>,
    /// Stored when this call creates the session.
    pub label: Option<String>,
    pub entries: Vec<NewEntry>,
    /// Also return up to this many transcript entries before the appended
    /// ones, read in the same unit (what the runtime is given); 0: none.
    pub history_limit: u32,
    pub owner_token: Option<OwnerToken>,
}

#[derive(Debug, Clone)]
pub struct Started {
    /// The record as it is now: `running`, with the sessionId and fence.
    pub record: RunRecord,
    pub acquired: Acquired,
    /// The seq of the first appended entry (0 when `entries` was empty).
    pub first_seq: u64,
    /// Up to `history_limit` entries before `first_seq`, ascending seq.
    pub history: Vec<TranscriptEntry>,
}

/// The fence a run writes under: its sessionId and fence token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldFence {
    pub session_id: SessionId,
    pub fence_token: u64,
}

/// FinishRun: the end of a run as one durable unit. `entries` (its
/// assistant turn) are appended under `writer`, the record becomes
/// `status` (terminal; a CAS on `expected_version`) with its outcome, and
/// the writer slot is released if `writer` still holds it. All of it
/// commits, or none of it: a stale fence refuses the whole call
/// (`StaleWriter` / `SessionReplaced`), so the terminal status is never
/// written beside a turn that was not.
#[derive(Debug, Clone)]
pub struct FinishRun {
    pub run_id: String,
    /// The run's session; must be its record's.
    pub key: SessionKey,
    pub expected_version: u64,
    /// A terminal status.
    pub status: RunStatus,
    pub outcome_json: Option<String>,
    /// The fence the run holds; `None`: it never took one (then `entries`
    /// must be empty).
    pub writer: Option<HeldFence>,
    pub entries: Vec<NewEntry>,
    pub owner_token: Option<OwnerToken>,
}

#[derive(Debug, Clone)]
pub struct Finished {
    /// The terminal record.
    pub record: RunRecord,
    /// The seq of the first appended entry (0 when none were).
    pub first_seq: u64,
    /// Whether the writer slot was released (false: the fence no longer
    /// held it, or there was none).
    pub released: bool,
}

/// What a coordinator sends with every write: the partition of the session it
/// writes, its member id and the epoch under which it holds that partition.
/// The store refuses the write (`STALE_OWNER`) unless that epoch is the
/// partition's current one and the member holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken {
    pub partition: u32,
    pub member: String,
    pub epoch: u64,
}

/// One partition's lease as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub partition: u32,
    /// The member holding it; `None` when released or never taken.
    pub owner: Option<String>,
    /// Where the owner serves (its advertised gRPC address), for hints.
    pub address: String,
    /// Bumped by every take; 0 = never owned. Never reused.
    pub epoch: u64,
    /// When the lease ends by the store's clock (Unix ms); another member may
    /// take the partition after that. Expiry elects, it does not fence.
    pub expires_at_ms: i64,
}

impl Lease {
    pub fn unowned(partition: u32) -> Self {
        Self {
            partition,
            owner: None,
            address: String::new(),
            epoch: 0,
            expires_at_ms: 0,
        }
    }

    pub fn held_by(&self, member: &str, now_ms: i64) -> bool {
        self.owner.as_deref() == Some(member) && self.expires_at_ms > now_ms
    }

    pub fn token(&self) -> Option<OwnerToken> {
        Some(OwnerToken {
            partition: self.partition,
            member: self.owner.clone()?,
            epoch: self.epoch,
        })
    }
}

#[derive(Debug, Clone)]
pub struct AcquireLeases {
    pub member: String,
    pub address: String,
    /// The partitions wanted; empty = every partition.
    pub partitions: Vec<u32>,
    pub ttl_ms: u64,
    /// Take partitions even when another member's lease has not expired
    /// (static ownership: "I am the one coordinator"). Otherwise only free,
    /// expired or own partitions are taken.
    pub steal: bool,
}

#[derive(Debug, Clone)]
pub struct RenewLeases {
    pub member: String,
    pub tokens: Vec<OwnerToken>,
    pub ttl_ms: u64,
}

/// The answer to AcquireLeases and RenewLeases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The leases now held (after a take, with their new epoch).
    pub granted: Vec<Lease>,
    /// The partitions asked for and not granted, as the store holds them.
    pub refused: Vec<Lease>,
    /// The store's clock when it decided.
    pub now_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTable {
    pub partition_count: u32,
    /// Every partition, in order.
    pub leases: Vec<Lease>,
    pub now_ms: i64,
}

/// A coordinator announcing itself in the member registry (placement:
/// every coordinator computes the same partition → member assignment from
/// the live members).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberHeartbeat {
    pub member: String,
    /// Where the member serves (its advertised gRPC address).
    pub address: String,
    /// How long the entry lives without another heartbeat (store's clock).
    pub ttl_ms: u64,
}

/// One live member of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub member: String,
    pub address: String,
    /// When the entry ends by the store's clock (Unix ms) without a
    /// heartbeat.
    pub expires_at_ms: i64,
}

/// The live members (entries not yet expired by the store's clock), sorted
/// by member id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberTable {
    pub members: Vec<Member>,
    pub now_ms: i64,
}

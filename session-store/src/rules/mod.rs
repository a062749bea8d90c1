//! The decisions of the store as pure functions over the persisted state.
//!
//! Every backend loads the state it needs inside one serializable unit (a redb
//! write transaction, a PostgreSQL transaction holding `FOR UPDATE` on the
//! session row, a mutex), applies one of these functions and writes back what
//! changed. So the fence semantics are written once and the backends differ
//! only in how they lock and persist.

//!
//! `history` (which transcript a page reads, and its window), `runs` (run
//! records and the start and finish of a run), `ownership` (partition
//! leases); the sessions' writer fence and settings are here.

use serde::{Deserialize, Serialize};

pub mod history;
pub mod ownership;
pub mod runs;

pub use history::*;
pub use runs::*;

use crate::error::StoreError;
use crate::key::SessionKey;
use crate::model::*;

/// The persisted state of one session key. It outlives resets and deletes so
/// that `last_fence` is never reused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSlot {
    pub last_fence: u64,
    /// `None`: the key has no session (never had, or it was deleted).
    pub current: Option<SessionState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    pub session_id: SessionId,
    pub writer: Option<Writer>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub label: Option<String>,
    pub last_run_id: Option<String>,
    pub last_run_status: Option<RunStatus>,
    /// = the seq of the last transcript entry of this sessionId.
    pub entry_count: u64,
    /// The session's settings, a JSON object as `serde_json` writes it
    /// (compact, keys sorted). Records written before settings existed
    /// have none: `"{}"`.
    #[serde(default = "empty_settings")]
    pub settings_json: String,
}

fn empty_settings() -> String {
    EMPTY_SETTINGS.to_owned()
}

/// The default of `--max-settings-bytes`: the largest settings object of a
/// session, as stored (compact JSON), in bytes.
pub const DEFAULT_MAX_SETTINGS_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub run_id: String,
    pub fence: u64,
}

impl SessionState {
    fn fresh(session_id: SessionId, now_ms: i64, label: Option<String>) -> Self {
        Self {
            session_id,
            writer: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            label,
            last_run_id: None,
            last_run_status: None,
            entry_count: 0,
            settings_json: empty_settings(),
        }
    }

    fn writer_run_id(&self) -> Option<&str> {
        self.writer.as_ref().map(|w| w.run_id.as_str())
    }
}

impl SessionSlot {
    pub fn view(&self, key: &SessionKey) -> Option<Session> {
        let state = self.current.as_ref()?;
        Some(Session {
            key: key.clone(),
            session_id: state.session_id,
            active_writer_run_id: state.writer.as_ref().map(|w| w.run_id.clone()),
            fence_token: self.last_fence,
            created_at_ms: state.created_at_ms,
            updated_at_ms: state.updated_at_ms,
            label: state.label.clone(),
            last_run_id: state.last_run_id.clone(),
            last_run_status: state.last_run_status,
            entry_count: state.entry_count,
            settings_json: state.settings_json.clone(),
        })
    }

    fn boxed_view(&self, key: &SessionKey) -> Option<Box<Session>> {
        self.view(key).map(Box::new)
    }
}

/// AcquireWriter. `new_session_id` is called only when a session is created.
/// A refusal leaves the slot untouched (as does every rule here).
pub fn acquire(
    slot: &mut SessionSlot,
    req: &AcquireWriter,
    now_ms: i64,
    new_session_id: impl FnOnce() -> SessionId,
) -> Result<Acquired, StoreError> {
    let key = &req.key;
    let session_created = match (&slot.current, &req.expected_session) {
        (None, ExpectedSession::Current) => true,
        (None, ExpectedSession::Id(expected)) => {
            return Err(StoreError::SessionReplaced {
                message: format!("session {expected} of {key} no longer exists"),
                current: None,
            });
        }
        (Some(state), ExpectedSession::Id(expected)) if state.session_id != *expected => {
            return Err(StoreError::SessionReplaced {
                message: format!(
                    "{key} expected session {expected}, current is {}",
                    state.session_id
                ),
                current: slot.boxed_view(key),
            });
        }
        (Some(_), _) => false,
    };
    let holder = slot
        .current
        .as_ref()
        .and_then(|s| s.writer_run_id())
        .map(str::to_owned);
    if req.mode == AcquireMode::Cas && holder != req.expected_writer {
        return Err(StoreError::WriterConflict {
            message: format!(
                "{key}: expected writer {}, current writer {}",
                describe_writer(req.expected_writer.as_deref()),
                describe_writer(holder.as_deref())
            ),
            current: slot.boxed_view(key),
        });
    }
    // Every check passed: from here on the slot changes.
    if session_created {
        slot.current = Some(SessionState::fresh(
            new_session_id(),
            now_ms,
            req.label.clone(),
        ));
    }
    // A run re-acquiring its own slot refreshes its fence; it supersedes nobody.
    let superseded_run_id = holder.filter(|h| *h != req.run_id);
    slot.last_fence += 1;
    let fence = slot.last_fence;
    let state = slot.current.as_mut().expect("session exists here");
    state.writer = Some(Writer {
        run_id: req.run_id.clone(),
        fence,
    });
    state.updated_at_ms = now_ms;
    state.last_run_id = Some(req.run_id.clone());
    state.last_run_status = Some(RunStatus::Running);
    Ok(Acquired {
        fence_token: fence,
        session: slot.view(key).expect("session exists here"),
        superseded_run_id,
        session_created,
    })
}

fn describe_writer(run_id: Option<&str>) -> String {
    run_id.map_or_else(|| "none".to_owned(), |r| format!("{r:?}"))
}

/// ReleaseWriter: clears the slot only if (run_id, fence) still holds it.
/// Returns whether it did.
pub fn release(slot: &mut SessionSlot, run_id: &str, fence: u64, now_ms: i64) -> bool {
    let Some(state) = slot.current.as_mut() else {
        return false;
    };
    let holds = state
        .writer
        .as_ref()
        .is_some_and(|w| w.run_id == run_id && w.fence == fence);
    if holds {
        state.writer = None;
        state.updated_at_ms = now_ms;
    }
    holds
}

/// Checks the fence of an Append and reserves its seqs. Returns the first
/// seq; the caller stores the entries `first..first + count`.
pub fn reserve_append(
    slot: &mut SessionSlot,
    req: &AppendEntries,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let fence = HeldFence {
        session_id: req.session_id,
        fence_token: req.fence_token,
    };
    reserve_seqs(
        slot,
        &req.key,
        &req.run_id,
        fence,
        req.entries.len(),
        now_ms,
    )
}

/// The fence check of every transcript write: `run_id` must hold the
/// slot of `key` under `fence`. Reserves `count` seqs and returns the first.
pub(super) fn reserve_seqs(
    slot: &mut SessionSlot,
    key: &SessionKey,
    run_id: &str,
    fence: HeldFence,
    count: usize,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let current = slot.boxed_view(key);
    let Some(state) = slot.current.as_mut() else {
        return Err(StoreError::SessionReplaced {
            message: format!("{key} has no session (deleted?)"),
            current: None,
        });
    };
    if state.session_id != fence.session_id {
        return Err(StoreError::SessionReplaced {
            message: format!(
                "{key}: session {} was replaced by {}",
                fence.session_id, state.session_id
            ),
            current,
        });
    }
    let holds = state
        .writer
        .as_ref()
        .is_some_and(|w| w.run_id == run_id && w.fence == fence.fence_token);
    if !holds {
        return Err(StoreError::StaleWriter {
            message: format!(
                "{key}: run {run_id:?} with fence {} is not the writer (writer {}, last fence {})",
                fence.fence_token,
                describe_writer(state.writer_run_id()),
                slot.last_fence
            ),
            current,
        });
    }
    let first = state.entry_count + 1;
    state.entry_count += count as u64;
    state.updated_at_ms = now_ms;
    Ok(first)
}

/// The stored form of the entries of a successful Append, from `first_seq` on.
pub fn stamp_entries(req: &AppendEntries, first_seq: u64, now_ms: i64) -> Vec<TranscriptEntry> {
    stamp(&req.entries, &req.run_id, first_seq, now_ms)
}

/// The stored form of `entries` written by `run_id`, from `first_seq` on.
pub fn stamp(
    entries: &[NewEntry],
    run_id: &str,
    first_seq: u64,
    now_ms: i64,
) -> Vec<TranscriptEntry> {
    entries
        .iter()
        .zip(first_seq..)
        .map(|(entry, seq)| TranscriptEntry {
            seq,
            role: entry.role.clone(),
            content_json: entry.content_json.clone(),
            timestamp_ms: entry.timestamp_ms.unwrap_or(now_ms),
            run_id: run_id.to_owned(),
            metadata: entry.metadata.clone(),
        })
        .collect()
}

/// ResetSession: a new sessionId; the writer of the old one is superseded.
/// The label and the settings stay: a reset replaces the transcript, not
/// the user's preferences for the session.
pub fn reset(
    slot: &mut SessionSlot,
    key: &SessionKey,
    now_ms: i64,
    new_session_id: SessionId,
) -> ResetOutcome {
    let old = slot.current.take();
    let label = old.as_ref().and_then(|s| s.label.clone());
    let mut fresh = SessionState::fresh(new_session_id, now_ms, label);
    if let Some(old) = &old {
        fresh.settings_json.clone_from(&old.settings_json);
    }
    slot.current = Some(fresh);
    ResetOutcome {
        session: slot.view(key).expect("session exists here"),
        previous_session_id: old.as_ref().map(|s| s.session_id),
        superseded_run_id: old.and_then(|s| s.writer.map(|w| w.run_id)),
    }
}

/// PatchSession: merges `req.patch_json` (a JSON object) into the settings
/// at the top level — `null` removes a key, any other value replaces it
/// whole — except `label`, which sets (a string) or clears (`null`) the
/// label and is not kept in the settings. A key without a session gets one
/// when `req.create` (a new sessionId, no entries, as a first AcquireWriter
/// makes), else the patch is refused. Merged settings longer than
/// `max_settings_bytes` are refused. The writer, the fence, the entries and
/// the last run stay; `updated_at_ms` moves to `now_ms`.
pub fn patch(
    slot: &mut SessionSlot,
    req: &PatchSession,
    now_ms: i64,
    max_settings_bytes: usize,
    new_session_id: impl FnOnce() -> SessionId,
) -> Result<PatchOutcome, StoreError> {
    let key = &req.key;
    let mut patch = parse_settings_patch(&req.patch_json)?;
    let label = match patch.remove(LABEL_SETTING) {
        None => None,
        Some(serde_json::Value::Null) => Some(None),
        Some(serde_json::Value::String(label)) => Some(Some(label)),
        Some(_) => {
            return Err(StoreError::invalid(
                "patch_json: \"label\" must be a string or null",
            ));
        }
    };
    let created = slot.current.is_none();
    if created && !req.create {
        return Err(StoreError::invalid(format!("no such session: {key}")));
    }
    let current = slot
        .current
        .as_ref()
        .map_or(EMPTY_SETTINGS, |s| s.settings_json.as_str());
    let mut settings: serde_json::Map<String, serde_json::Value> = serde_json::from_str(current)
        .map_err(|e| StoreError::internal(format!("{key}: stored settings are unreadable: {e}")))?;
    for (name, value) in patch {
        if value.is_null() {
            settings.remove(&name);
        } else {
            settings.insert(name, value);
        }
    }
    let merged = serde_json::to_string(&settings).expect("a JSON map always serializes");
    if merged.len() > max_settings_bytes {
        return Err(StoreError::invalid(format!(
            "the session's settings would be {} bytes after this patch; the maximum is {max_settings_bytes}",
            merged.len()
        )));
    }
    // Every check passed: from here on the slot changes.
    let state = slot
        .current
        .get_or_insert_with(|| SessionState::fresh(new_session_id(), now_ms, None));
    state.settings_json = merged;
    if let Some(label) = label {
        state.label = label;
    }
    state.updated_at_ms = now_ms;
    Ok(PatchOutcome {
        session: slot.view(key).expect("session exists here"),
        created,
    })
}

/// Parses the `patch_json` of a PatchSession: it must be a JSON object.
pub fn parse_settings_patch(
    patch_json: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, StoreError> {
    match serde_json::from_str::<serde_json::Value>(patch_json) {
        Ok(serde_json::Value::Object(patch)) => Ok(patch),
        Ok(other) => Err(StoreError::invalid(format!(
            "patch_json must be a JSON object, not {}",
            json_kind(&other)
        ))),
        Err(e) => Err(StoreError::invalid(format!(
            "patch_json is not valid JSON: {e}"
        ))),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// DeleteSession: the key has no session afterwards; its fence counter stays.
pub fn delete(slot: &mut SessionSlot) -> DeleteOutcome {
    let old = slot.current.take();
    DeleteOutcome {
        deleted: old.is_some(),
        previous_session_id: old.as_ref().map(|s| s.session_id),
        superseded_run_id: old.and_then(|s| s.writer.map(|w| w.run_id)),
    }
}

/// Whether a session matches a ListSessions filter.
pub fn list_matches(session: &Session, query: &ListQuery) -> bool {
    if query
        .updated_since_ms
        .is_some_and(|since| session.updated_at_ms < since)
    {
        return false;
    }
    match &query.search {
        None => true,
        Some(needle) => {
            let needle = needle.to_lowercase();
            session.key.as_str().to_lowercase().contains(&needle)
                || session
                    .label
                    .as_deref()
                    .is_some_and(|l| l.to_lowercase().contains(&needle))
        }
    }
}

/// The ListSessions order and page: newest `updated_at` first, at most `limit`.
pub fn newest_first(mut sessions: Vec<Session>, limit: u32) -> Vec<Session> {
    sessions.sort_by_key(|s| std::cmp::Reverse(s.updated_at_ms));
    sessions.truncate(limit as usize);
    sessions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_acquire_creates_nothing() {
        let mut slot = SessionSlot::default();
        let req = AcquireWriter {
            owner_token: None,
            key: SessionKey::parse("main").unwrap(),
            expected_session: ExpectedSession::Current,
            expected_writer: Some("someone".into()),
            run_id: "run".into(),
            mode: AcquireMode::Cas,
            label: None,
        };
        let err = acquire(&mut slot, &req, 1, uuid::Uuid::new_v4).unwrap_err();
        assert_eq!(err.code(), "WRITER_CONFLICT");
        assert_eq!(slot, SessionSlot::default());
    }

    fn patch_req(patch_json: &str, create: bool) -> PatchSession {
        PatchSession {
            key: SessionKey::parse("main").unwrap(),
            patch_json: patch_json.into(),
            create,
        }
    }

    #[test]
    fn a_refused_patch_changes_nothing() {
        let mut slot = SessionSlot::default();
        for (patch, create) in [("{}", false), ("[]", true), (r#"{"label":false}"#, true)] {
            let req = patch_req(patch, create);
            let err = super::patch(&mut slot, &req, 1, 64, uuid::Uuid::new_v4).unwrap_err();
            assert_eq!(err.code(), "INVALID_ARGUMENT", "{patch}");
            assert_eq!(slot, SessionSlot::default(), "{patch}");
        }
        let req = patch_req(r#"{"b":1,"a":{"z":null},"label":"L"}"#, true);
        let made = super::patch(&mut slot, &req, 5, 64, uuid::Uuid::new_v4).unwrap();
        assert!(made.created);
        // Compact, keys sorted; a nested null is a value like any other.
        assert_eq!(made.session.settings_json, r#"{"a":{"z":null},"b":1}"#);
        assert_eq!(made.session.label.as_deref(), Some("L"));
        assert_eq!(
            (made.session.created_at_ms, made.session.updated_at_ms),
            (5, 5)
        );
        let before = slot.clone();
        let req = patch_req(&format!(r#"{{"c":"{}"}}"#, "x".repeat(64)), false);
        let err = super::patch(&mut slot, &req, 6, 64, uuid::Uuid::new_v4).unwrap_err();
        assert!(err.to_string().contains("the maximum is 64"), "{err}");
        assert_eq!(slot, before);
    }

    #[test]
    fn a_reset_keeps_the_settings() {
        let mut slot = SessionSlot::default();
        let key = SessionKey::parse("main").unwrap();
        super::patch(
            &mut slot,
            &patch_req(r#"{"m":1}"#, true),
            1,
            64,
            uuid::Uuid::new_v4,
        )
        .unwrap();
        let out = reset(&mut slot, &key, 2, uuid::Uuid::new_v4());
        assert_eq!(out.session.settings_json, r#"{"m":1}"#);
        assert!(delete(&mut slot).deleted);
        let out = reset(&mut slot, &key, 3, uuid::Uuid::new_v4());
        assert_eq!(
            out.session.settings_json, "{}",
            "a deleted session's are gone"
        );
    }
}

//! Input limits, enforced in one place: `Checked` wraps any backend and
//! refuses bad input with `InvalidArgument` before anything is written.
//! Every limit is configurable (see `config.rs` and docs/session-store.md).

use clawgate_common::limits;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::store::SessionStore;

#[derive(Debug, Clone)]
pub struct Limits {
    /// One entry: role + content_json + usage_json + stop_reason, in bytes.
    pub max_entry_bytes: usize,
    pub max_entries_per_append: usize,
    /// All entries of one Append together, in bytes.
    pub max_append_bytes: usize,
    pub default_history_limit: u32,
    pub max_history_limit: u32,
    /// The largest `max_chars` a History call may ask for; also the budget
    /// applied when it asks for none, so a page always fits a gRPC message.
    pub max_history_chars: u32,
    pub default_list_limit: u32,
    pub max_list_limit: u32,
    pub max_label_chars: usize,
    /// kind, fingerprint, owner, role.
    pub max_name_chars: usize,
    /// request_json and outcome_json of a run record, in bytes.
    pub max_run_payload_bytes: usize,
    /// A session's settings after a PatchSession, as stored (compact JSON),
    /// in bytes. It depends on the settings already stored, so the backend
    /// checks it inside the patch's own transaction: `server::open_backend`
    /// gives it this value.
    pub max_settings_bytes: usize,
    /// The most live entries of the member registry: a heartbeat of a new
    /// member past it is refused (existing members keep heartbeating). It
    /// depends on the entries stored, so the backend checks it inside the
    /// heartbeat's own unit: `server::open_backend` gives it this value.
    pub max_members: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entry_bytes: limits::STORE_MAX_ENTRY_BYTES,
            max_entries_per_append: 256,
            max_append_bytes: limits::STORE_MAX_APPEND_BYTES,
            default_history_limit: 200,
            max_history_limit: 1000,
            max_history_chars: limits::STORE_MAX_HISTORY_CHARS as u32,
            default_list_limit: 100,
            max_list_limit: 1000,
            max_label_chars: 512,
            max_name_chars: 256,
            max_run_payload_bytes: limits::STORE_MAX_RUN_PAYLOAD_BYTES,
            max_settings_bytes: crate::rules::DEFAULT_MAX_SETTINGS_BYTES,
            max_members: crate::rules::ownership::DEFAULT_MAX_MEMBERS,
        }
    }
}

/// NUL characters cannot be stored by every backend (PostgreSQL text), so
/// no backend takes them.
fn reject_nul(field: &str, value: &str) -> StoreResult<()> {
    if value.contains('\0') {
        return Err(StoreError::invalid(format!(
            "{field} must not contain NUL characters"
        )));
    }
    Ok(())
}

impl Limits {
    fn check_name(&self, field: &str, value: &str, allow_empty: bool) -> StoreResult<()> {
        reject_nul(field, value)?;
        if value.is_empty() && !allow_empty {
            return Err(StoreError::invalid(format!("{field} must not be empty")));
        }
        if value.chars().count() > self.max_name_chars {
            return Err(StoreError::invalid(format!(
                "{field} is longer than {} characters",
                self.max_name_chars
            )));
        }
        Ok(())
    }

    fn check_label(&self, label: Option<&str>) -> StoreResult<()> {
        reject_nul("label", label.unwrap_or_default())?;
        match label {
            Some(l) if l.chars().count() > self.max_label_chars => Err(StoreError::invalid(
                format!("label is longer than {} characters", self.max_label_chars),
            )),
            _ => Ok(()),
        }
    }

    fn check_run_payload(&self, field: &str, value: &str) -> StoreResult<()> {
        reject_nul(field, value)?;
        if value.len() > self.max_run_payload_bytes {
            return Err(StoreError::invalid(format!(
                "{field} is {} bytes; the maximum is {}",
                value.len(),
                self.max_run_payload_bytes
            )));
        }
        Ok(())
    }

    /// The shape of a PatchSession that does not depend on the stored
    /// settings: an object, a label within the label limit. (The size of
    /// the merged settings is the backend's check.)
    pub fn check_patch(&self, req: &PatchSession) -> StoreResult<()> {
        let patch = crate::rules::parse_settings_patch(&req.patch_json)?;
        if let Some(serde_json::Value::String(label)) = patch.get(LABEL_SETTING) {
            self.check_label(Some(label))?;
        }
        Ok(())
    }

    pub fn check_entries(&self, entries: &[NewEntry]) -> StoreResult<()> {
        if entries.is_empty() {
            return Err(StoreError::invalid("append needs at least one entry"));
        }
        if entries.len() > self.max_entries_per_append {
            return Err(StoreError::invalid(format!(
                "append has {} entries; the maximum is {}",
                entries.len(),
                self.max_entries_per_append
            )));
        }
        let mut total = 0usize;
        for (index, entry) in entries.iter().enumerate() {
            let at = |msg: String| StoreError::invalid(format!("entries[{index}]: {msg}"));
            self.check_name("role", &entry.role, false)
                .map_err(|e| at(e.to_string()))?;
            let size = entry.role.len()
                + entry.content_json.len()
                + entry.metadata.usage_json.as_deref().map_or(0, str::len)
                + entry.metadata.stop_reason.as_deref().map_or(0, str::len);
            if size > self.max_entry_bytes {
                return Err(at(format!(
                    "entry is {size} bytes; the maximum is {}",
                    self.max_entry_bytes
                )));
            }
            if let Some(stop_reason) = &entry.metadata.stop_reason {
                reject_nul("stop_reason", stop_reason).map_err(|e| at(e.to_string()))?;
            }
            serde_json::from_str::<serde::de::IgnoredAny>(&entry.content_json)
                .map_err(|e| at(format!("content_json is not valid JSON: {e}")))?;
            if let Some(usage) = &entry.metadata.usage_json {
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(usage)
                    .map_err(|e| at(format!("usage_json is not a JSON object: {e}")))?;
            }
            total += size;
        }
        if total > self.max_append_bytes {
            return Err(StoreError::invalid(format!(
                "append is {total} bytes; the maximum is {}",
                self.max_append_bytes
            )));
        }
        Ok(())
    }

    /// Drops the oldest entries of `entries` (ascending seq) until their
    /// content fits `max_history_chars`; the newest one always stays.
    pub fn trim_to_budget(&self, entries: &mut Vec<TranscriptEntry>) {
        crate::rules::keep_within_chars(entries, self.max_history_chars, true);
    }

    /// Resolves the defaults of a history query and checks its ranges.
    pub fn history_query(&self, mut query: HistoryQuery) -> StoreResult<HistoryQuery> {
        if query.limit == 0 {
            query.limit = self.default_history_limit;
        }
        if query.limit > self.max_history_limit {
            return Err(StoreError::invalid(format!(
                "limit must be 1..={}, got {}",
                self.max_history_limit, query.limit
            )));
        }
        match query.max_chars {
            Some(0) => return Err(StoreError::invalid("maxChars must be at least 1")),
            Some(n) if n > self.max_history_chars => {
                return Err(StoreError::invalid(format!(
                    "maxChars must be 1..={}, got {n}",
                    self.max_history_chars
                )));
            }
            Some(_) => {}
            None => query.max_chars = Some(self.max_history_chars),
        }
        Ok(query)
    }

    pub fn list_query(&self, mut query: ListQuery) -> StoreResult<ListQuery> {
        if query.limit == 0 {
            query.limit = self.default_list_limit;
        }
        if query.limit > self.max_list_limit {
            return Err(StoreError::invalid(format!(
                "limit must be 1..={}, got {}",
                self.max_list_limit, query.limit
            )));
        }
        if let Some(search) = &query.search {
            self.check_label(Some(search))
                .map_err(|_| StoreError::invalid("search is too long"))?;
        }
        Ok(query)
    }
}

/// A store that checks every input against `Limits` before its backend sees it.
pub struct Checked<S> {
    inner: S,
    limits: Limits,
}

impl<S> Checked<S> {
    pub fn new(inner: S, limits: Limits) -> Self {
        Self { inner, limits }
    }
}

session_store_api::forward_store! {
    impl[S: SessionStore] SessionStore for Checked<S> {
        async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
            validate_run_id(&req.run_id)?;
            if let Some(expected) = &req.expected_writer {
                validate_run_id(expected)?;
            }
            self.limits.check_label(req.label.as_deref())?;
            self.inner.acquire_writer(req).await
        }

        async fn release_writer(
            &self,
            key: &SessionKey,
            run_id: &str,
            fence_token: u64,
            owner_token: Option<&OwnerToken>,
        ) -> StoreResult<Released> {
            validate_run_id(run_id)?;
            self.inner
                .release_writer(key, run_id, fence_token, owner_token)
                .await
        }

        async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
            validate_run_id(&req.run_id)?;
            self.limits.check_entries(&req.entries)?;
            self.inner.append(req).await
        }

        async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
            let query = self.limits.history_query(query)?;
            self.inner.history(query).await
        }

        async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
            let query = self.limits.list_query(query)?;
            self.inner.list_sessions(query).await
        }

        async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
            self.limits.check_patch(&req)?;
            self.inner.patch_session(req).await
        }

        async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
            validate_run_id(&new.run_id)?;
            self.limits.check_name("kind", &new.kind, false)?;
            self.limits
                .check_name("fingerprint", &new.fingerprint, true)?;
            self.limits.check_name("owner", &new.owner, true)?;
            self.limits
                .check_run_payload("request_json", &new.request_json)?;
            if new.status.is_terminal() || new.status == RunStatus::Running {
                return Err(StoreError::invalid(format!(
                    "a run is created accepted or queued, not {}",
                    new.status.as_str()
                )));
            }
            self.inner.create_run(new).await
        }

        async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
            validate_run_id(&update.run_id)?;
            if let Some(owner) = &update.owner {
                self.limits.check_name("owner", owner, true)?;
            }
            if let Some(outcome) = &update.outcome_json {
                self.limits.check_run_payload("outcome_json", outcome)?;
            }
            self.inner.update_run(update).await
        }

        async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
            validate_run_id(&req.run_id)?;
            if let Some(expected) = &req.expected_writer {
                validate_run_id(expected)?;
            }
            self.limits.check_label(req.label.as_deref())?;
            self.limits.check_name("owner", &req.owner, true)?;
            if !req.entries.is_empty() {
                self.limits.check_entries(&req.entries)?;
            }
            if req.history_limit > self.limits.max_history_limit {
                return Err(StoreError::invalid(format!(
                    "history_limit must be 0..={}, got {}",
                    self.limits.max_history_limit, req.history_limit
                )));
            }
            let mut started = self.inner.start_run(req).await?;
            // The history budget of a History call without maxChars, so that
            // the answer always fits a gRPC message: the newest entries stay.
            self.limits.trim_to_budget(&mut started.history);
            Ok(started)
        }

        async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
            validate_run_id(&req.run_id)?;
            if let Some(outcome) = &req.outcome_json {
                self.limits.check_run_payload("outcome_json", outcome)?;
            }
            if !req.entries.is_empty() {
                self.limits.check_entries(&req.entries)?;
            }
            self.inner.finish_run(req).await
        }

        async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
            validate_run_id(run_id)?;
            self.inner.get_run(run_id).await
        }
    }
    forward(self => self.inner) [
        get_session, reset_session, delete_session, list_active_runs, purge_expired_runs,
    ];
    // Lease requests are checked by every backend (`rules::ownership`):
    // their bounds depend on the partition count the backend holds.
    forward(self => self.inner) [acquire_leases, renew_leases, release_leases, list_leases];
    // So are the member registry's (`rules::ownership::check_heartbeat`),
    // and its cap (`max_members`) depends on the entries stored.
    forward(self => self.inner) [heartbeat_member, leave_member, list_members];
}

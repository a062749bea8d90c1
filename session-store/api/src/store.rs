//! The session-store trait: the domain API every backend (and the remote gRPC
//! client) implements. No tonic types here.

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::StoreResult;
use crate::key::SessionKey;
use crate::model::*;

#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Compare-and-swap on (sessionId, activeWriterRunId); returns a new fence.
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired>;
    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released>;
    /// Appends atomically if (sessionId, runId, fence) still match. Durable
    /// when it returns Ok.
    async fn append(&self, req: AppendEntries) -> StoreResult<Appended>;
    /// An unknown key gives an empty page, not an error.
    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage>;
    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>>;
    /// Newest (updated_at) first.
    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>>;
    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome>;
    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome>;
    /// Merges a JSON object into the session's settings (top-level merge
    /// patch; `label` goes to the label), atomically. Creates the session
    /// when asked to and it has none. Not a transcript write: no fence, no
    /// owner token, the writer, entries and runs are untouched.
    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome>;

    /// Insert-if-absent keyed by runId.
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome>;
    /// CAS on the record version; terminal records never change.
    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord>;
    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>>;
    /// UpdateRun(running) + AcquireWriter + Append in one durable unit.
    async fn start_run(&self, req: StartRun) -> StoreResult<Started>;
    /// Append + UpdateRun(terminal) + ReleaseWriter in one durable unit.
    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished>;
    /// Every non-terminal run, optionally of one owner, oldest first.
    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>>;
    /// Removes terminal records that ended before `ended_before_ms`; active
    /// records are never removed. Returns how many went.
    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64>;

    // Partition ownership. Every write above that carries an owner token is
    // checked against these leases in the same unit as the write.

    /// Takes partitions (bumping each one's epoch): free or expired ones, the
    /// member's own, and with `steal` any.
    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant>;
    /// Extends leases whose epoch is still current and held by the member.
    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant>;
    /// Gives up leases still held under these tokens, at once, so that
    /// another member can take them without waiting for expiry. Returns the
    /// partitions released.
    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>>;
    /// Every partition's lease and the partition count.
    async fn list_leases(&self) -> StoreResult<LeaseTable>;

    // The member registry: which coordinators are alive, for placement.
    // Liveness only; ownership is the leases' (and the epoch fences).

    /// Creates or extends the member's entry, to the store's now + TTL
    /// (pruning expired entries); answers the live members. A member not in
    /// the registry is refused with `InvalidArgument` while the registry
    /// holds its cap of live members (`--max-members`).
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable>;
    /// Removes the member's entry at once (a graceful leave). Returns
    /// whether it had a live one.
    async fn leave_member(&self, member: &str) -> StoreResult<bool>;
    /// The live members.
    async fn list_members(&self) -> StoreResult<MemberTable>;
}

/// Wall-clock Unix milliseconds, the store's clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A shared store is a store (lets decorators wrap `Arc<dyn SessionStore>`).
#[async_trait]
impl<T: SessionStore + ?Sized> SessionStore for std::sync::Arc<T> {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        (**self).acquire_writer(req).await
    }
    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        (**self)
            .release_writer(key, run_id, fence_token, owner_token)
            .await
    }
    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        (**self).append(req).await
    }
    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        (**self).history(query).await
    }
    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        (**self).get_session(key).await
    }
    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        (**self).list_sessions(query).await
    }
    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        (**self).reset_session(key).await
    }
    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        (**self).delete_session(key, delete_transcript).await
    }
    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        (**self).patch_session(req).await
    }
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        (**self).create_run(new).await
    }
    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        (**self).update_run(update).await
    }
    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        (**self).get_run(run_id).await
    }
    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        (**self).start_run(req).await
    }
    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        (**self).finish_run(req).await
    }
    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        (**self).list_active_runs(owner).await
    }
    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        (**self).purge_expired_runs(ended_before_ms).await
    }
    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        (**self).acquire_leases(req).await
    }
    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        (**self).renew_leases(req).await
    }
    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        (**self).release_leases(tokens).await
    }
    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        (**self).list_leases().await
    }
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        (**self).heartbeat_member(req).await
    }
    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        (**self).leave_member(member).await
    }
    async fn list_members(&self) -> StoreResult<MemberTable> {
        (**self).list_members().await
    }
}

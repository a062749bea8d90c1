//! The session-store trait: the domain API every backend (and the remote gRPC
//! client) implements. No tonic types here.

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

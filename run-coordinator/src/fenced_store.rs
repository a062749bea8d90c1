//! The store as the coordinator uses it: every result passes by
//! `Ownership::observe`, so whichever write first meets `STALE_OWNER` ends
//! this instance's tenure, wherever in the code it was made.

use std::sync::Arc;

use async_trait::async_trait;
use session_store_api::model::*;
use session_store_api::{SessionKey, SessionStore, StoreResult};

use crate::ownership::Ownership;

pub struct FencedStore {
    inner: Arc<dyn SessionStore>,
    ownership: Arc<Ownership>,
}

impl FencedStore {
    pub fn new(inner: Arc<dyn SessionStore>, ownership: Arc<Ownership>) -> Self {
        Self { inner, ownership }
    }

    fn seen<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        if let Err(err) = &result {
            self.ownership.observe(err);
        }
        result
    }
}

#[async_trait]
impl SessionStore for FencedStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        self.seen(self.inner.acquire_writer(req).await)
    }
    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let result = self
            .inner
            .release_writer(key, run_id, fence_token, owner_token)
            .await;
        self.seen(result)
    }
    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        self.seen(self.inner.append(req).await)
    }
    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        self.inner.history(query).await
    }
    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        self.inner.get_session(key).await
    }
    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        self.inner.list_sessions(query).await
    }
    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        self.seen(self.inner.reset_session(key).await)
    }
    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        self.seen(self.inner.delete_session(key, delete_transcript).await)
    }
    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        self.inner.patch_session(req).await
    }
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        self.seen(self.inner.create_run(new).await)
    }
    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        self.seen(self.inner.update_run(update).await)
    }
    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        self.seen(self.inner.start_run(req).await)
    }
    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        self.seen(self.inner.finish_run(req).await)
    }
    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        self.inner.get_run(run_id).await
    }
    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        self.inner.list_active_runs(owner).await
    }
    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        self.inner.purge_expired_runs(ended_before_ms).await
    }
    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        self.inner.acquire_leases(req).await
    }
    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        self.inner.renew_leases(req).await
    }
    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        self.inner.release_leases(tokens).await
    }
    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        self.inner.list_leases().await
    }
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        self.inner.heartbeat_member(req).await
    }
    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        self.inner.leave_member(member).await
    }
    async fn list_members(&self) -> StoreResult<MemberTable> {
        self.inner.list_members().await
    }
}

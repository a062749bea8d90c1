//! The store as the coordinator uses it: the result of every session,
//! transcript and run write passes by `Ownership::observe`, so whichever
//! write first meets `STALE_OWNER` ends this instance's tenure, wherever in
//! the code it was made.

use std::future::Future;
use std::sync::Arc;

use session_store_api::{SessionStore, StoreOperation, StoreResult};

use crate::ownership::Ownership;

pub struct FencedStore {
    inner: Arc<dyn SessionStore>,
    ownership: Arc<Ownership>,
}

impl FencedStore {
    pub fn new(inner: Arc<dyn SessionStore>, ownership: Arc<Ownership>) -> Self {
        Self { inner, ownership }
    }

    /// `call`'s result, once `Ownership` has seen its error.
    async fn seen<T>(
        &self,
        _: StoreOperation,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let result = call.await;
        if let Err(err) = &result {
            self.ownership.observe(err);
        }
        result
    }
}

session_store_api::forward_store! {
    impl[] SessionStore for FencedStore {}
    // The session, transcript and run writes: their errors are seen.
    forward(self => self.inner, through seen) [
        acquire_writer, release_writer, append, reset_session, delete_session, create_run,
        update_run, start_run, finish_run,
    ];
    // Reads, settings patches and the ownership calls (leases, members):
    // straight through.
    forward(self => self.inner) [
        history, get_session, list_sessions, patch_session, get_run, list_active_runs,
        purge_expired_runs, acquire_leases, renew_leases, release_leases, list_leases,
        heartbeat_member, leave_member, list_members,
    ];
}

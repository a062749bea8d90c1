//! `Deadlined`: every operation of the wrapped store answers within the
//! operation timeout, or `UNAVAILABLE`. A database that stops answering (a
//! silent network, a paused server, a pool whose connections are all
//! stuck) then costs a caller the timeout, not its wait forever, and the
//! coordinator's own deadlines keep their meaning.
//!
//! A write that timed out may still land later (its statements may already
//! be on their way to the database): its outcome is unknown, exactly as when
//! the store dies mid-call, and callers treat it so (a retry with the same
//! key or fence is idempotent; the owner fence refuses a stale one).

use std::future::Future;
use std::time::Duration;

use crate::error::{StoreError, StoreResult};
use crate::store::SessionStore;
use session_store_api::StoreOperation;

/// The default operation timeout.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Deadlined<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Deadlined<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self { inner, timeout }
    }

    async fn bounded<T>(
        &self,
        operation: StoreOperation,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "{} did not finish within {:?} (SESSION_STORE_OPERATION_TIMEOUT): \
                 the database is not answering",
                operation.as_str(),
                self.timeout
            ))),
        }
    }
}

session_store_api::forward_store! {
    impl[S: SessionStore] SessionStore for Deadlined<S> {}
    forward(self => self.inner, through bounded) [
        acquire_writer, release_writer, append, history, get_session, list_sessions,
        reset_session, delete_session, patch_session, create_run, update_run, get_run,
        start_run, finish_run, list_active_runs, purge_expired_runs, acquire_leases,
        renew_leases, release_leases, list_leases, heartbeat_member, leave_member,
        list_members,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryStore;
    use crate::key::SessionKey;
    use crate::model::RunRecord;

    /// A store whose `get_run` never answers; the rest is a memory store.
    struct Stuck(MemoryStore);

    session_store_api::forward_store! {
        impl[] SessionStore for Stuck {
            async fn get_run(&self, _run_id: &str) -> StoreResult<Option<RunRecord>> {
                std::future::pending().await
            }
        }
        forward(self => self.0) [
            acquire_writer, release_writer, append, history, get_session, list_sessions,
            reset_session, delete_session, patch_session, create_run, update_run,
            start_run, finish_run, list_active_runs, purge_expired_runs, acquire_leases,
            renew_leases, release_leases, list_leases, heartbeat_member, leave_member,
            list_members,
        ];
    }

    #[tokio::test(start_paused = true)]
    async fn an_operation_that_does_not_answer_is_unavailable_after_the_timeout() {
        let store = Deadlined::new(Stuck(MemoryStore::new()), Duration::from_secs(3));
        let started = tokio::time::Instant::now();
        let err = store.get_run("r1").await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("get_run did not finish within 3s")),
            "{err:?}"
        );
        // The others answer as the wrapped store does.
        let key = SessionKey::parse("main").unwrap();
        assert!(store.get_session(&key).await.is_ok());
    }
}

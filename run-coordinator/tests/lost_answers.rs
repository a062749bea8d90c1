//! A store write that landed but whose answer was lost (a cut connection,
//! the store's operation timeout): the coordinator cannot know, and must
//! neither hang on it nor end the run twice. The store here commits the
//! chosen write and then answers UNAVAILABLE, once.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use run_coordinator::Coordinator;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator_api::model::RunStatus;
use session_store::backend::memory::MemoryStore;
use session_store_api::StoreOperation;
use session_store_api::model::*;
use session_store_api::{SessionKey, SessionStore, StoreError, StoreResult};

/// A memory store that loses the answer of the next call of `operation`.
struct LosesAnswer {
    inner: MemoryStore,
    operation: StoreOperation,
    armed: Mutex<bool>,
}

impl LosesAnswer {
    async fn maybe_lose<T>(
        &self,
        operation: StoreOperation,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let result = call.await;
        let lose = operation == self.operation && std::mem::take(&mut *self.armed.lock().unwrap());
        match (lose, result) {
            (true, Ok(_)) => Err(StoreError::Unavailable("the answer was lost".into())),
            (_, result) => result,
        }
    }
}

session_store_api::forward_store! {
    impl[] SessionStore for LosesAnswer {}
    forward(self => self.inner, through maybe_lose) [
        acquire_writer, release_writer, append, history, get_session, list_sessions,
        reset_session, delete_session, patch_session, create_run, update_run, get_run,
        start_run, finish_run, list_active_runs, purge_expired_runs, acquire_leases,
        renew_leases, release_leases, list_leases, heartbeat_member, leave_member,
        list_members,
    ];
}

async fn coordinator_losing(operation: StoreOperation) -> (Coordinator, Arc<LosesAnswer>) {
    let store = Arc::new(LosesAnswer {
        inner: MemoryStore::new(),
        operation,
        armed: Mutex::new(true),
    });
    let runtime = Recording::echo(1, 2);
    let coordinator = Coordinator::start(store.clone(), runtime, CoordinatorConfig::default())
        .await
        .unwrap();
    (coordinator, store)
}

async fn ended(coordinator: &Coordinator, run_id: &str) -> RunStatus {
    let waited = coordinator
        .wait(run_id, std::time::Duration::from_secs(86_400))
        .await
        .unwrap();
    assert!(waited.terminal, "{run_id} did not end: {waited:?}");
    waited.snapshot.unwrap().status
}

#[tokio::test(start_paused = true)]
async fn a_start_that_landed_unanswered_ends_the_run_and_the_session_goes_on() {
    let (coordinator, store) = coordinator_losing(StoreOperation::StartRun).await;
    coordinator
        .submit(local_req("lost-start", "s", "hello", serde_json::json!({})))
        .await
        .unwrap();
    // The start landed (running, the writer slot, the user turn), its
    // answer did not: the run ends as a store failure, and its record too.
    assert_eq!(ended(&coordinator, "lost-start").await, RunStatus::Error);
    let record = store.inner.get_run("lost-start").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Error, "{record:?}");
    // The session's next run takes the slot the first left behind.
    coordinator
        .submit(local_req("after", "s", "again", serde_json::json!({})))
        .await
        .unwrap();
    assert_eq!(ended(&coordinator, "after").await, RunStatus::Ok);
}

#[tokio::test(start_paused = true)]
async fn a_finish_that_landed_unanswered_is_adopted() {
    let (coordinator, store) = coordinator_losing(StoreOperation::FinishRun).await;
    coordinator
        .submit(local_req(
            "lost-finish",
            "s",
            "hello",
            serde_json::json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(ended(&coordinator, "lost-finish").await, RunStatus::Ok);
    let record = store.inner.get_run("lost-finish").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Ok, "{record:?}");
    let key = SessionKey::parse("s").unwrap();
    let query = HistoryQuery {
        key,
        limit: 10,
        cursor: HistoryCursor::Latest,
        max_chars: None,
        session_id: None,
    };
    let history = store.inner.history(query).await;
    let roles: Vec<_> = history
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.role)
        .collect();
    assert_eq!(roles, ["user", "assistant"], "answered once");
}

/// The caller's retry of a submit whose `CreateRun` landed unanswered
/// finds the record its own first attempt wrote: the run is this
/// instance's to run, not "in flight" somewhere. (Before, the retry was
/// answered in flight and the run stayed queued for ever: the chaos
/// schedule met it when the store was killed under an admission.)
#[tokio::test(start_paused = true)]
async fn a_create_that_landed_unanswered_runs_on_the_retry() {
    let (coordinator, store) = coordinator_losing(StoreOperation::CreateRun).await;
    let submit = || local_req("lost-create", "s", "hello", serde_json::json!({}));
    coordinator
        .submit(submit())
        .await
        .expect_err("the first attempt's answer was lost");
    let record = store.inner.get_run("lost-create").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Queued, "it landed: {record:?}");
    let retried = coordinator.submit(submit()).await.unwrap();
    assert_eq!(
        retried.admission,
        run_coordinator_api::model::Admission::Accepted,
        "{retried:?}"
    );
    assert_eq!(ended(&coordinator, "lost-create").await, RunStatus::Ok);
    let record = store.inner.get_run("lost-create").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Ok, "{record:?}");
    // A third submit of the key is answered from the end, as any retry.
    let again = coordinator.submit(submit()).await.unwrap();
    assert_eq!(
        again.admission,
        run_coordinator_api::model::Admission::Completed
    );
}

//! Admission and lanes through the real gRPC services (seed experiments A–B,
//! key reuse, the global cap, reject mode).

mod common;

use clawgate_proto::run_coordinator::v1 as pb;
use common::*;
use run_coordinator::config::CoordinatorConfig;
use session_store::SessionKey;
use session_store::SessionStore;
use session_store::model::{HistoryCursor, HistoryQuery, RunStatus};

async fn transcript(cluster: &Cluster, key: &str) -> Vec<session_store::model::TranscriptEntry> {
    cluster
        .store
        .history(HistoryQuery {
            key: SessionKey::parse(key).unwrap(),
            limit: 1000,
            cursor: HistoryCursor::After(0),
            max_chars: None,
            session_id: None,
        })
        .await
        .unwrap()
        .entries
}

async fn same_key_during_a_run_is_in_flight(backend: Backend) {
    let runtime = Recording::echo(40, 4);
    let cluster = Cluster::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client.clone();
    let first = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(first.admission, pb::Admission::Accepted as i32);
    assert!(first.accepted_at_ms > 0);
    let again = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(again.admission, pb::Admission::InFlight as i32);
    assert_eq!(again.snapshot.as_ref().unwrap().run_id, "key-a");

    let done = finished(&mut client, "key-a").await;
    assert_eq!(status(&done), RunStatus::Ok);
    assert_eq!(done.text, "hello there");
    assert_eq!(runtime.count("key-a"), 1, "the runtime ran once");
    let entries = transcript(&cluster, "main").await;
    let roles: Vec<&str> = entries.iter().map(|e| e.role.as_str()).collect();
    assert_eq!(roles, vec!["user", "assistant"]);
    assert!(entries.iter().all(|e| e.run_id == "key-a"));

    // Same key after completion: the cached terminal, nothing runs again.
    let cached = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(cached.admission, pb::Admission::Completed as i32);
    assert_eq!(cached.snapshot.unwrap().text, "hello there");
    // Same key, different payload: the reuse error, nothing runs.
    let reused = client
        .submit(submit_req("key-a", "main", "something else"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), tonic::Code::AlreadyExists);
    let detail = run_coordinator::grpc::status::detail_of(&reused).unwrap();
    assert_eq!(detail.code, pb::ErrorCode::KeyReused as i32);
    assert_eq!(runtime.count("key-a"), 1);
    assert_eq!(transcript(&cluster, "main").await.len(), 2);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_a_same_key_twice_embedded() {
    same_key_during_a_run_is_in_flight(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_a_same_key_twice_postgres() {
    same_key_during_a_run_is_in_flight(Backend::Postgres).await;
}

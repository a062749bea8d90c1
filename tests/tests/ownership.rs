//! Two coordinators started on one store (a rolling update, `replicas: 2`):
//! the second takes every partition, and the first, mid-run, stops at its
//! next write with STALE_OWNER instead of finishing a run the second one
//! has already settled. No run ends both executed and lost.
//!
//! Before the ownership fence, the second coordinator's recovery marked the
//! first one's live run `lost` while the first kept running it and kept
//! serving: this test then failed waiting for the first to exit.

use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::{System, wait_for};

const DEADLINE: Duration = Duration::from_secs(30);

async fn coordinator(url: String) -> RunCoordinatorClient<tonic::transport::Channel> {
    RunCoordinatorClient::connect(url).await.unwrap()
}

async fn snapshot(
    client: &mut RunCoordinatorClient<tonic::transport::Channel>,
    run_id: &str,
) -> pb::RunSnapshot {
    let got = client
        .get(pb::GetRequest {
            run_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    got.snapshot.expect("the run is known")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_takes_over_and_the_first_stops() {
    // Each run takes about 4 × 500 ms on the first coordinator.
    let mut cluster = System::builder()
        .echo(4, Duration::from_millis(500))
        .start()
        .await;
    let mut first = coordinator(cluster.coordinator().url()).await;
    let run_id = uuid::Uuid::new_v4().to_string();
    first
        .submit(pb::SubmitRequest {
            run_id: run_id.clone(),
            session_key: "main".into(),
            kind: "chat".into(),
            message: "a slow reply".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_for("the run to start", DEADLINE, async || {
        snapshot(&mut first, &run_id).await.status == store_pb::RunStatus::Running as i32
    })
    .await;

    // The second coordinator starts on the same store while the run executes.
    let fast = cluster.coordinator_spec().echo(1, Duration::from_millis(1));
    let second = cluster.add_coordinator(fast).await;

    // The first one's next write is refused: it stops, non-zero, saying why.
    let status = cluster.coordinators[0].process.wait_exit(DEADLINE).await;
    let output = cluster.coordinator().output_text();
    assert!(
        !status.success(),
        "the first coordinator exited cleanly:\n{output}"
    );
    assert!(
        output.contains("STALE_OWNER"),
        "no STALE_OWNER in:\n{output}"
    );

    // The run was settled once, by the new owner, as lost; its result was
    // never written: no assistant turn of it in the transcript.
    let mut second_client = coordinator(cluster.coordinators[second].url()).await;
    let settled = snapshot(&mut second_client, &run_id).await;
    assert_eq!(
        settled.status,
        store_pb::RunStatus::Lost as i32,
        "{settled:?}"
    );
    let mut store = SessionStoreClient::connect(cluster.store_url())
        .await
        .unwrap();
    let history = store
        .history(store_pb::HistoryRequest {
            session_key: "main".into(),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let turns: Vec<(&str, &str)> = history
        .entries
        .iter()
        .map(|e| (e.run_id.as_str(), e.role.as_str()))
        .collect();
    assert!(
        !turns.contains(&(run_id.as_str(), "assistant")),
        "a lost run's reply was written: {turns:?}"
    );

    // The second coordinator serves: a new run on the same session completes.
    let next = uuid::Uuid::new_v4().to_string();
    second_client
        .submit(pb::SubmitRequest {
            run_id: next.clone(),
            session_key: "main".into(),
            kind: "chat".into(),
            message: "after the takeover".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let done = second_client
        .wait(pb::WaitRequest {
            run_id: next.clone(),
            timeout_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner();
    let done = done.snapshot.expect("a snapshot");
    assert_eq!(done.status, store_pb::RunStatus::Ok as i32, "{done:?}");
}

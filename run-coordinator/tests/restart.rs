//! Restart recovery with the real binary: the coordinator process is
//! SIGKILLed mid-run and started again against the same store, on each
//! backend (an embedded file, a PostgreSQL schema). The runtime is an
//! external gRPC runtime in this test process, so executions are counted
//! across both coordinator processes.

mod common;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_system_tests::process::{Process, service_command};
use common::*;
use run_coordinator::runtime::grpc::serve_runtime;
use session_store::model::RunStatus;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;

/// The real binary, every listener on port 0.
async fn start_coordinator(store_url: &str, runtime_url: &str) -> Process {
    let mut command = service_command(env!("CARGO_BIN_EXE_run-coordinator"));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store-address", store_url])
        .args(["--runtime", "grpc", "--runtime-address", runtime_url])
        .args(["--max-executing", "1"]);
    Process::start(command, "run-coordinator", "run coordinator serving gRPC").await
}

async fn connect_when_up(process: &Process) -> RunCoordinatorClient<Channel> {
    let what = format!(
        "the coordinator to answer; its output:\n{}",
        process.output_text()
    );
    wait_for(what, DEADLINE, async || {
        let mut client = RunCoordinatorClient::connect(process.url()).await.ok()?;
        let answered = client.list_active(pb::ListActiveRequest::default()).await;
        answered.is_ok().then_some(client)
    })
    .await
}

async fn a_killed_coordinator_leaves_lost_runs_and_requeues_the_rest(backend: Backend) {
    let stop = CancellationToken::new();
    // The store in this process, the coordinators its binary.
    let sandbox = Sandbox::builder()
        .backend(backend)
        .coordinators(0)
        .start()
        .await;
    let store_url = sandbox.store_url().to_owned();

    let runtime = Recording::echo(40, 50);
    let runtime_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runtime_url = format!("http://{}", runtime_listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(serve_runtime(runtime.clone()))
            .serve_with_incoming_shutdown(
                TcpIncoming::from(runtime_listener),
                stop.clone().cancelled_owned(),
            ),
    );

    let mut process = start_coordinator(&store_url, &runtime_url).await;
    let mut client = connect_when_up(&process).await;
    let long = "a long answer ".repeat(20);
    submit(&mut client, submit_req("doomed", "main", &long)).await;
    submit(
        &mut client,
        submit_req("queued-same", "main", "after the doomed one"),
    )
    .await;
    submit(
        &mut client,
        submit_req("queued-other", "other", "waits for the cap"),
    )
    .await;
    // Mid-run: the runtime is streaming the first run.
    let running = wait_for("the first run to stream", DEADLINE, async || {
        let snapshot = client
            .get(pb::GetRequest {
                run_id: "doomed".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        (!snapshot.text.is_empty()).then_some(snapshot)
    })
    .await;
    process.kill().await; // SIGKILL

    let mut process = start_coordinator(&store_url, &runtime_url).await;
    let mut client = connect_when_up(&process).await;
    let lost = finished(&mut client, "doomed").await;
    assert_eq!(status(&lost), RunStatus::Lost);
    assert_eq!(lost.error.as_ref().unwrap().kind, "lost");
    // Resubmitting the lost run's key answers `lost` and runs nothing.
    let again = submit(&mut client, submit_req("doomed", "main", &long)).await;
    assert_eq!(again.admission, pb::Admission::Completed as i32);
    assert_eq!(status(again.snapshot.as_ref().unwrap()), RunStatus::Lost);
    // The zombie's fence no longer writes.
    let stale = append_with_fence_of(&sandbox.store, &running)
        .await
        .unwrap_err();
    assert_eq!(stale.code(), "STALE_WRITER");
    // The queued runs ran after the restart, exactly once each.
    for id in ["queued-same", "queued-other"] {
        assert_eq!(
            status(&finished(&mut client, id).await),
            RunStatus::Ok,
            "{id}"
        );
    }
    let counts = counts(&runtime.executions());
    assert_eq!(counts.get("doomed"), Some(&1));
    assert_eq!(counts.get("queued-same"), Some(&1));
    assert_eq!(counts.get("queued-other"), Some(&1));
    process.kill().await;
    stop.cancel();
    sandbox.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_leaves_lost_runs_and_requeues_the_rest_embedded() {
    a_killed_coordinator_leaves_lost_runs_and_requeues_the_rest(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_leaves_lost_runs_and_requeues_the_rest_postgres() {
    a_killed_coordinator_leaves_lost_runs_and_requeues_the_rest(Backend::Postgres).await;
}

//! Active/standby coordinators on PostgreSQL, as separate processes, with
//! real signals: one store, a leader and a standby (`--ownership lease`),
//! one edge given only the first coordinator's address, and clients sending
//! continuously (a retry reuses its key). Three failovers in a row:
//!
//! (a) SIGKILL the leader: the standby takes over after the lease expires;
//! (b) SIGSTOP the leader past the TTL, then SIGCONT: its late writes are
//!     refused with STALE_OWNER and it exits non-zero;
//! (c) SIGTERM the leader (planned): it drains and releases its leases, and
//!     no run ends `lost`.
//!
//! After all: no run executed twice (a counting runtime), every acknowledged
//! run is terminal, every client saw each of its runs end (a lost run as a
//! chat error, never silence), and no transcript has interleaved or repeated
//! turns; runs appear in each session in the order they were sent. The
//! takeover times are printed (docs/high-availability.md has measured ones).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::EdgeClient;
use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::cluster::TOKEN;
use clawgate_system_tests::ha::{
    self, RENEW, TTL, lease_coordinator, postgres_url, serving, stale_owner_refusals,
};
use clawgate_system_tests::process::Process;
use clawgate_system_tests::records::run_record;
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::transcript::{check_send_order, run_blocks};
use serde_json::json;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);
const SESSIONS: usize = 3;

async fn coordinator(store: &Process, runtime: &CountingRuntime) -> Process {
    lease_coordinator(&store.url(), &runtime.url()).await
}

async fn until_serving(process: &Process, since: Instant) -> Duration {
    ha::until_serving(process, since, DEADLINE).await
}

/// A standby answers UNAVAILABLE, NOT_OWNER, naming the leader's address.
async fn assert_redirects_to(standby: &Process, leader: &Process) {
    use clawgate_proto::run_coordinator::v1 as pb;
    use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
    let mut client = RunCoordinatorClient::connect(standby.url()).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let refused = client
            .submit(pb::SubmitRequest {
                run_id: "to-a-standby".into(),
                session_key: "main".into(),
                kind: "chat".into(),
                message: "hello".into(),
                ..Default::default()
            })
            .await
            .expect_err("a standby admits nothing");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        let detail: pb::CoordinatorErrorDetail = clawgate_proto::status_detail::detail_of(
            &refused,
            "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail",
        )
        .expect("a coordinator error detail");
        assert_eq!(detail.code, pb::ErrorCode::NotOwner as i32);
        // The hint comes from the standby's first attempt to take over.
        if detail.leader_address.as_deref() == Some(leader.url().as_str()) {
            return;
        }
        assert!(Instant::now() < deadline, "no leader hint: {detail:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `runs.resume` of a run of the old leader answers the documented reset:
/// its event log went with the old leader's epoch.
async fn assert_resume_resets(edge: &Process) {
    let url = format!("ws://{}", edge.address);
    let mut client = EdgeClient::connect(&url, TOKEN, OPERATOR_SCOPES).await;
    let res = client
        .request("runs.resume", json!({ "runId": "ha-0-0", "fromSeq": 0 }))
        .await;
    assert_eq!(res["ok"], false, "{res}");
    assert_eq!(
        res["error"]["details"]["code"], "RESUME_UNAVAILABLE",
        "{res}"
    );
}

/// One run as a client saw it: its id, how it ended (the chat state), and
/// the test phase it was sent in.
type SeenRun = (String, String, &'static str);

/// What the clients saw: per session, the runs in the order they were
/// acknowledged, with how each ended for the client.
#[derive(Default)]
struct Seen {
    runs: Mutex<HashMap<usize, Vec<SeenRun>>>,
    phase: Mutex<&'static str>,
}

/// One client per session: sends a run, retries it (same key) until the
/// edge accepts it, waits for its end, sends the next, until `stop`.
async fn client(edge_url: String, session: usize, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let mut client = EdgeClient::connect(&edge_url, TOKEN, OPERATOR_SCOPES).await;
    let session_key = format!("ha-{session}");
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let run_id = format!("{session_key}-{i}");
        let phase = *seen.phase.lock().unwrap();
        let deadline = Instant::now() + DEADLINE;
        let state = loop {
            if let Some(state) = ha::chat_run(&mut client, &session_key, &run_id).await {
                break state;
            }
            assert!(Instant::now() < deadline, "{run_id} never accepted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        seen.runs
            .lock()
            .unwrap()
            .entry(session)
            .or_default()
            .push((run_id, state, phase));
    }
}

/// Waits until every client finished `more` runs after now.
async fn progress(seen: &Seen, more: usize, output: impl Fn() -> String) {
    let counts = || -> Vec<usize> {
        let runs = seen.runs.lock().unwrap();
        (0..SESSIONS)
            .map(|s| runs.get(&s).map_or(0, Vec::len))
            .collect()
    };
    ha::until_progress(counts, more, DEADLINE, output).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_loses_nothing_it_acknowledged() {
    let schema = format!("ha_{}", uuid::Uuid::new_v4().simple());
    let runtime = CountingRuntime::start(Duration::from_millis(150)).await;
    let store = ha::start_pg_store(&schema).await;
    let mut leader = coordinator(&store, &runtime).await;
    until_serving(&leader, Instant::now()).await;
    let mut standby = coordinator(&store, &runtime).await;
    assert!(!serving(&standby).await, "a standby does not serve");
    assert_redirects_to(&standby, &leader).await;
    let edge = ha::start_edge(&store.url(), &leader.url()).await;
    clawgate_system_tests::process::until_ready(edge.address, || edge.output().join("\n")).await;

    let seen = Arc::new(Seen::default());
    *seen.phase.lock().unwrap() = "before";
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..SESSIONS)
        .map(|s| {
            tokio::spawn(client(
                format!("ws://{}", edge.address),
                s,
                seen.clone(),
                stop.clone(),
            ))
        })
        .collect();
    progress(&seen, 2, || edge.output().join("\n")).await;

    // (a) SIGKILL the leader.
    *seen.phase.lock().unwrap() = "kill";
    let killed = Instant::now();
    leader.kill().await;
    let took = until_serving(&standby, killed).await;
    clawgate_system_tests::report(&format!(
        "takeover after SIGKILL: {} ms (TTL {} ms, renew {} ms)",
        took.as_millis(),
        TTL.as_millis(),
        RENEW.as_millis()
    ));
    assert_resume_resets(&edge).await;
    progress(&seen, 2, || {
        format!(
            "{}\n==== new leader ====\n{}",
            edge.output().join("\n"),
            standby.output().join("\n")
        )
    })
    .await;

    // (b) SIGSTOP the leader past its TTL; its standby takes over; SIGCONT.
    *seen.phase.lock().unwrap() = "stop";
    let mut next = coordinator(&store, &runtime).await;
    let refused_before = stale_owner_refusals(&store).await;
    let stopped = Instant::now();
    standby.signal("STOP");
    let took = until_serving(&next, stopped).await;
    clawgate_system_tests::report(&format!("takeover after SIGSTOP: {} ms", took.as_millis()));
    progress(&seen, 2, || edge.output().join("\n")).await;
    standby.signal("CONT");
    let status = standby.wait_exit(DEADLINE).await;
    let output = standby.output().join("\n");
    assert!(
        !status.success(),
        "the stopped leader exited cleanly:\n{output}"
    );
    assert!(
        output.contains("STALE_OWNER"),
        "no STALE_OWNER in:\n{output}"
    );
    let refused = stale_owner_refusals(&store).await - refused_before;
    clawgate_system_tests::report(&format!(
        "late writes of the stopped leader refused with STALE_OWNER: {refused}"
    ));
    assert!(
        refused > 0.0,
        "the stopped leader's late writes were not refused"
    );

    // (c) SIGTERM the leader: a planned handover.
    *seen.phase.lock().unwrap() = "planned";
    let last = coordinator(&store, &runtime).await;
    let terminated = Instant::now();
    next.signal("TERM");
    let took = until_serving(&last, terminated).await;
    clawgate_system_tests::report(&format!("handover after SIGTERM: {} ms", took.as_millis()));
    let status = next.wait_exit(DEADLINE).await;
    assert!(
        status.success(),
        "a planned handover exits 0:\n{}",
        next.output().join("\n")
    );
    progress(&seen, 2, || edge.output().join("\n")).await;

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    // No run executed twice.
    let executions = runtime.executions();
    let twice: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "runs executed more than once: {twice:?}");

    let mut store_client = SessionStoreClient::connect(store.url()).await.unwrap();
    let runs = seen.runs.lock().unwrap().clone();
    for (session, acknowledged) in &runs {
        for (run_id, state, phase) in acknowledged {
            let record = run_record(&mut store_client, run_id)
                .await
                .unwrap_or_else(|| panic!("acknowledged run {run_id} has no record"));
            let status = store_pb::RunStatus::try_from(record.status).unwrap();
            assert!(
                matches!(status, store_pb::RunStatus::Ok | store_pb::RunStatus::Lost),
                "{run_id}: {status:?}"
            );
            if status == store_pb::RunStatus::Lost {
                assert_eq!(state, "error", "{run_id} was lost: the client saw {state}");
                assert_ne!(*phase, "planned", "{run_id} was lost in a planned handover");
            } else {
                assert_eq!(state, "final", "{run_id}");
            }
        }
        // The transcript: each run's turns together, once, in send order.
        let blocks = run_blocks(&mut store_client, &format!("ha-{session}")).await;
        let sent: Vec<&str> = acknowledged.iter().map(|(r, ..)| r.as_str()).collect();
        if let Err(e) = check_send_order(&blocks, &sent) {
            panic!("ha-{session}: {e}");
        }
    }
    let total: usize = runs.values().map(Vec::len).sum();
    let lost = runs
        .values()
        .flatten()
        .filter(|(_, s, _)| s == "error")
        .count();
    clawgate_system_tests::report(&format!(
        "runs acknowledged: {total}, lost in failovers: {lost}, executions: {}",
        executions.len()
    ));

    drop((last, edge));
    session_store::backend::postgres::drop_schema(&postgres_url(), &schema)
        .await
        .unwrap();
}

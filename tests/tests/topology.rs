//! The deployed topology, as separate processes: two store replicas on one
//! PostgreSQL behind a balancer (a Kubernetes Service), a coordinator leader
//! and standby, two edges, clients on both edges sending continuously (a
//! retry reuses its key, a client whose edge goes away reconnects). While
//! they send: one edge is killed and comes back, the coordinator leader is
//! rolled (SIGTERM; a new standby starts), one store replica is killed.
//! Afterwards: no run executed twice, no acknowledged run missing, every run
//! terminal, both edges serving. The figures are printed.
//!
//! The output shows a panic or two from `tests/src/client.rs` ("Connection
//! reset"): the attempts of clients whose edge was killed, each in a task of
//! its own, which the client then retries on the restarted edge.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::EdgeClient;
use clawgate_system_tests::balancer::Balancer;
use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::cluster::TOKEN;
use clawgate_system_tests::ha::{self, lease_coordinator, postgres_url};
use clawgate_system_tests::process::{http_ok, until_ready};
use clawgate_system_tests::records::run_record;
use clawgate_system_tests::runtime::CountingRuntime;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);
/// Clients per edge (one session each).
const CLIENTS: usize = 2;

/// Where an edge is now (it moves when it restarts).
type EdgeUrl = Arc<Mutex<String>>;

/// Runs acknowledged per client, in order: (runId, how it ended).
type Seen = Arc<Mutex<BTreeMap<String, Vec<(String, String)>>>>;

/// One attempt at a run on `client` (see `ha::chat_run`); panics, and so
/// ends its task, when the edge goes away.
async fn attempt(
    mut client: EdgeClient,
    session: String,
    run_id: String,
) -> (EdgeClient, Option<String>) {
    let state = ha::chat_run(&mut client, &session, &run_id).await;
    (client, state)
}

async fn client(edge: EdgeUrl, session: String, seen: Seen, stop: Arc<AtomicBool>) {
    let mut connection: Option<EdgeClient> = None;
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let run_id = format!("{session}-{i}");
        let deadline = Instant::now() + DEADLINE;
        let state = loop {
            assert!(Instant::now() < deadline, "{run_id} never ended");
            let open = match connection.take() {
                Some(open) => open,
                None => {
                    let url = edge.lock().unwrap().clone();
                    let connect =
                        async move { EdgeClient::connect(&url, TOKEN, OPERATOR_SCOPES).await };
                    match tokio::spawn(connect).await {
                        Ok(open) => open,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            };
            // In a task of its own: a vanished edge ends only this attempt.
            match tokio::spawn(attempt(open, session.clone(), run_id.clone())).await {
                Ok((open, Some(state))) => {
                    connection = Some(open);
                    break state;
                }
                Ok((open, None)) => connection = Some(open),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        seen.lock()
            .unwrap()
            .entry(session.clone())
            .or_default()
            .push((run_id, state));
    }
}

/// Waits until every client finished `more` runs after now.
async fn progress(seen: &Seen, sessions: &[String], more: usize, output: impl Fn() -> String) {
    let counts = || -> Vec<usize> {
        let seen = seen.lock().unwrap();
        sessions
            .iter()
            .map(|s| seen.get(s).map_or(0, Vec::len))
            .collect()
    };
    ha::until_progress(counts, more, DEADLINE, output).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_topology_survives_an_edge_a_leader_and_a_store_replica() {
    let schema = format!("topo_{}", uuid::Uuid::new_v4().simple());
    let runtime = CountingRuntime::start(Duration::from_millis(100)).await;
    let mut store_a = ha::start_pg_store(&schema).await;
    let store_b = ha::start_pg_store(&schema).await;
    let store = Balancer::start(vec![store_a.address, store_b.address]).await;
    let leader = lease_coordinator(&store.url(), &runtime.url()).await;
    ha::until_serving(&leader, Instant::now(), DEADLINE).await;
    let standby = lease_coordinator(&store.url(), &runtime.url()).await;
    let coordinators = format!("{},{}", leader.url(), standby.url());
    let mut edge_a = ha::start_edge(&store.url(), &coordinators).await;
    let edge_b = ha::start_edge(&store.url(), &coordinators).await;
    for edge in [&edge_a, &edge_b] {
        until_ready(edge.address, || edge.output().join("\n")).await;
    }
    let urls = [&edge_a, &edge_b].map(|e| Arc::new(Mutex::new(format!("ws://{}", e.address))));

    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut sessions = Vec::new();
    let mut clients = Vec::new();
    for (e, url) in urls.iter().enumerate() {
        for c in 0..CLIENTS {
            let session = format!("topo-{e}-{c}");
            sessions.push(session.clone());
            clients.push(tokio::spawn(client(
                url.clone(),
                session,
                seen.clone(),
                stop.clone(),
            )));
        }
    }
    let output = || {
        format!(
            "{}\n{}",
            edge_b.output().join("\n"),
            standby.output().join("\n")
        )
    };
    progress(&seen, &sessions, 2, output).await;

    // One edge is killed and comes back (elsewhere); its clients reconnect.
    let killed = Instant::now();
    edge_a.kill().await;
    edge_a = ha::start_edge(&store.url(), &coordinators).await;
    *urls[0].lock().unwrap() = format!("ws://{}", edge_a.address);
    progress(&seen, &sessions, 2, output).await;
    clawgate_system_tests::report(&format!(
        "edge killed and restarted: every client 2 runs further after {} ms",
        killed.elapsed().as_millis()
    ));

    // The coordinator leader is rolled: SIGTERM (a planned handover), then
    // the replacement starts as the new standby.
    let mut leader = leader;
    let rolled = Instant::now();
    leader.signal("TERM");
    let took = ha::until_serving(&standby, rolled, DEADLINE).await;
    assert!(
        leader.wait_exit(DEADLINE).await.success(),
        "a planned handover exits 0"
    );
    let _replacement = lease_coordinator(&store.url(), &runtime.url()).await;
    progress(&seen, &sessions, 2, output).await;
    clawgate_system_tests::report(&format!(
        "leader rolled: the standby served after {} ms",
        took.as_millis()
    ));

    // One store replica is killed; the balancer sends everything to the other.
    let lost_store = Instant::now();
    store_a.kill().await;
    progress(&seen, &sessions, 2, output).await;
    clawgate_system_tests::report(&format!(
        "store replica killed: every client 2 runs further after {} ms",
        lost_store.elapsed().as_millis()
    ));

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    for edge in [&edge_a, &edge_b] {
        assert!(
            http_ok(edge.address, "/readyz").await,
            "{} serves",
            edge.name
        );
    }
    let executions = runtime.executions();
    let twice: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "runs executed more than once: {twice:?}");
    let mut records = SessionStoreClient::connect(store.url()).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for (run_id, _) in seen.values().flatten() {
        let record = run_record(&mut records, run_id)
            .await
            .unwrap_or_else(|| panic!("acknowledged run {run_id} is missing"));
        let status = store_pb::RunStatus::try_from(record.status).unwrap();
        assert!(
            !matches!(
                status,
                store_pb::RunStatus::Accepted
                    | store_pb::RunStatus::Queued
                    | store_pb::RunStatus::Running
            ),
            "{run_id} is not terminal: {status:?}"
        );
        *by_status.entry(format!("{status:?}")).or_default() += 1;
    }
    let total: usize = seen.values().map(Vec::len).sum();
    clawgate_system_tests::report(&format!(
        "runs acknowledged: {total}, by status: {by_status:?}, executions: {}",
        executions.len()
    ));
    drop((edge_a, edge_b, standby, store_b));
    session_store::backend::postgres::drop_schema(&postgres_url(), &schema)
        .await
        .unwrap();
}

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
use clawgate_system_tests::Client;
use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::process::{http_ok, until_ready};
use clawgate_system_tests::records::run_record;
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::sandbox::Backend;
use clawgate_system_tests::system::{CoordinatorSpec, Runtime, System, chat_run};
use clawgate_system_tests::wait::{Pacer, until_each_grows};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);
/// Clients per edge (one session each).
const CLIENTS: usize = 2;

/// Where an edge is now (it moves when it restarts).
type EdgeUrl = Arc<Mutex<String>>;

/// Runs acknowledged per client, in order: (runId, how it ended).
type Seen = Arc<Mutex<BTreeMap<String, Vec<(String, String)>>>>;

/// One attempt at a run on `client` (see `chat_run`); panics, and so
/// ends its task, when the edge goes away.
async fn attempt(mut client: Client, session: String, run_id: String) -> (Client, Option<String>) {
    let state = chat_run(&mut client, &session, &run_id).await;
    (client, state)
}

async fn client(edge: EdgeUrl, session: String, seen: Seen, stop: Arc<AtomicBool>) {
    let mut connection: Option<Client> = None;
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let run_id = format!("{session}-{i}");
        // A loop, not `wait_for`: this runs in a spawned task.
        let mut pacer = Pacer::new(format!("{run_id} to end"), DEADLINE);
        let state = loop {
            let open = match connection.take() {
                Some(open) => Some(open),
                None => {
                    let url = edge.lock().unwrap().clone();
                    let connect = async move { Client::connect(&url, OPERATOR_SCOPES).await };
                    // A connect that panicked (the edge is away) is retried.
                    tokio::spawn(connect).await.ok()
                }
            };
            // In a task of its own: a vanished edge ends only this attempt.
            let attempted = match open {
                Some(open) => tokio::spawn(attempt(open, session.clone(), run_id.clone()))
                    .await
                    .ok(),
                None => None,
            };
            if let Some((open, state)) = attempted {
                connection = Some(open);
                if let Some(state) = state {
                    break state;
                }
            }
            if let Err(timed_out) = pacer.pause(None).await {
                panic!("{timed_out}");
            }
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
    let what = format!("every client to finish {more} more runs");
    until_each_grows(what, counts, more, DEADLINE, output).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_topology_survives_an_edge_a_leader_and_a_store_replica() {
    let runtime = CountingRuntime::start(Duration::from_millis(100)).await;
    let lease = CoordinatorSpec::lease(Runtime::Grpc(runtime.url()), Duration::from_secs(20));
    // Two store replicas behind a balancer; the leader serves before the
    // standby starts, and the edges come last, given both.
    let mut system = System::builder()
        .backend(Backend::Postgres)
        .store_replicas(2)
        .coordinator(lease.clone())
        .coordinators(0)
        .edges(0)
        .start()
        .await;
    let leader = system.add_coordinator(lease.clone()).await;
    system.coordinators[leader]
        .until_serving(Instant::now(), DEADLINE)
        .await;
    let standby = system.add_coordinator(lease.clone()).await;
    for _ in 0..2 {
        let edge = system.add_edge().await;
        until_ready(system.edges[edge].address, || system.output()).await;
    }
    let urls = [0, 1].map(|e| Arc::new(Mutex::new(system.edge_url(e))));

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
    let output = |system: &System| {
        format!(
            "{}\n{}",
            system.edges[1].output_text(),
            system.coordinators[standby].process.output_text()
        )
    };
    progress(&seen, &sessions, 2, || output(&system)).await;

    // One edge is killed and comes back (elsewhere); its clients reconnect.
    let killed = Instant::now();
    system.restart_edge(0).await;
    *urls[0].lock().unwrap() = system.edge_url(0);
    progress(&seen, &sessions, 2, || output(&system)).await;
    clawgate_system_tests::report(&format!(
        "edge killed and restarted: every client 2 runs further after {} ms",
        killed.elapsed().as_millis()
    ));

    // The coordinator leader is rolled: SIGTERM (a planned handover), then
    // the replacement starts as the new standby.
    let rolled = Instant::now();
    system.coordinators[leader].process.signal("TERM");
    let took = system.coordinators[standby]
        .until_serving(rolled, DEADLINE)
        .await;
    assert!(
        system.coordinators[leader]
            .process
            .wait_exit(DEADLINE)
            .await
            .success(),
        "a planned handover exits 0"
    );
    system.add_coordinator(lease).await;
    progress(&seen, &sessions, 2, || output(&system)).await;
    clawgate_system_tests::report(&format!(
        "leader rolled: the standby served after {} ms",
        took.as_millis()
    ));

    // One store replica is killed; the balancer sends everything to the other.
    let lost_store = Instant::now();
    system.stores[0].kill().await;
    progress(&seen, &sessions, 2, || output(&system)).await;
    clawgate_system_tests::report(&format!(
        "store replica killed: every client 2 runs further after {} ms",
        lost_store.elapsed().as_millis()
    ));

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    for edge in &system.edges {
        assert!(
            http_ok(edge.address, "/readyz").await,
            "{} serves",
            edge.name
        );
    }
    let executions = runtime.executions();
    let twice: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "runs executed more than once: {twice:?}");
    let mut records = SessionStoreClient::connect(system.store_url())
        .await
        .unwrap();
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
    system.finish().await;
}

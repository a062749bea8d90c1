//! The deployed topology, as separate processes: two store replicas on one
//! PostgreSQL behind a balancer (a Kubernetes Service), a coordinator leader
//! and standby, two edges, clients on both edges sending continuously (a
//! retry reuses its key, a client whose edge goes away reconnects). While
//! they send: one edge is killed and comes back, the coordinator leader is
//! rolled (SIGTERM; a new standby starts), one store replica is killed.
//! Afterwards: no run executed twice, no acknowledged run missing, every run
//! terminal, both edges serving. The figures are printed.
//!
//! A second test rolls three balanced coordinators as the StatefulSet's
//! controller does (highest ordinal first, one at a time: SIGTERM, exit, a
//! replacement at the same stable address, Ready, `minReadySeconds`) under
//! the same load, and checks that each replacement takes a share of the
//! partitions and that no run executed twice and every acknowledged one
//! ended.
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
use clawgate_system_tests::records::{lease_table, live_leases_by_address, run_record};
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::sandbox::Backend;
use clawgate_system_tests::system::{CoordinatorSpec, RENEW, Runtime, System, chat_run};
use clawgate_system_tests::wait::{Pacer, poll, until_each_grows};
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

/// Clients sending runs continuously, [`CLIENTS`] per edge, one session each.
struct Load {
    seen: Seen,
    sessions: Vec<String>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(urls: &[EdgeUrl]) -> Self {
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
        Self {
            seen,
            sessions,
            stop,
            clients,
        }
    }

    /// Stops the clients and checks what they saw: every edge still
    /// serves, no run executed twice, every acknowledged run is recorded
    /// and terminal. Returns the figures to report.
    async fn end_and_check(self, system: &System, runtime: &CountingRuntime) -> String {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
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
        let seen = self.seen.lock().unwrap().clone();
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
        format!(
            "runs acknowledged: {total}, by status: {by_status:?}, executions: {}",
            executions.len()
        )
    }
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

    let load = Load::start(&urls);
    let (seen, sessions) = (&load.seen, &load.sessions);
    let output = |system: &System| {
        format!(
            "{}\n{}",
            system.edges[1].output_text(),
            system.coordinators[standby].process.output_text()
        )
    };
    progress(seen, sessions, 2, || output(&system)).await;

    // One edge is killed and comes back (elsewhere); its clients reconnect.
    let killed = Instant::now();
    system.restart_edge(0).await;
    *urls[0].lock().unwrap() = system.edge_url(0);
    progress(seen, sessions, 2, || output(&system)).await;
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
    progress(seen, sessions, 2, || output(&system)).await;
    clawgate_system_tests::report(&format!(
        "leader rolled: the standby served after {} ms",
        took.as_millis()
    ));

    // One store replica is killed; the balancer sends everything to the other.
    let lost_store = Instant::now();
    system.stores[0].kill().await;
    progress(seen, sessions, 2, || output(&system)).await;
    clawgate_system_tests::report(&format!(
        "store replica killed: every client 2 runs further after {} ms",
        lost_store.elapsed().as_millis()
    ));

    let figures = load.end_and_check(&system, &runtime).await;
    clawgate_system_tests::report(&figures);
    system.finish().await;
}

/// The roll's handoff timeout, and the StatefulSet's `minReadySeconds` for
/// it as the manifests size it: one handoff and two renew rounds.
const HANDOFF: Duration = Duration::from_secs(3);
const MIN_READY: Duration = HANDOFF.saturating_add(RENEW).saturating_add(RENEW);
const COORDINATORS: usize = 3;

/// Live partition leases held at `address`.
async fn held_at(
    store: &mut SessionStoreClient<tonic::transport::Channel>,
    address: &str,
) -> usize {
    live_leases_by_address(&lease_table(store).await)
        .get(address)
        .copied()
        .unwrap_or(0)
}

/// Waits until coordinator `n` holds partitions; how many. Panics with the
/// system's output after [`DEADLINE`].
async fn until_holding(
    store: &mut SessionStoreClient<tonic::transport::Channel>,
    system: &System,
    n: usize,
) -> usize {
    let address = system.coordinators[n].url();
    let what = format!("coordinator {n} to hold partitions");
    let holding = poll(what, DEADLINE, async || {
        let held = held_at(store, &address).await;
        (held > 0).then_some(held)
    })
    .await;
    holding.unwrap_or_else(|timed_out| panic!("{timed_out}:\n{}", system.output()))
}

/// `kubectl rollout restart statefulset/run-coordinator`, as the StatefulSet
/// controller carries it out, under load: from the highest ordinal down, one
/// pod at a time, SIGTERM (a planned handover), its exit, a replacement at
/// the same stable address (the pod's DNS name: here the proxy in front of
/// it), then Ready, then `minReadySeconds`, before the next. Each
/// replacement joins and takes a share of the partitions; the clients keep
/// going; at the end no run executed twice and every acknowledged run ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_roll_of_the_coordinators_under_load() {
    let runtime = CountingRuntime::start(Duration::from_millis(100)).await;
    let handoff = format!("{}ms", HANDOFF.as_millis());
    let balanced = CoordinatorSpec::lease(Runtime::Grpc(runtime.url()), Duration::from_secs(5))
        .args(&["--placement", "balanced", "--handoff-timeout", &handoff]);
    let mut system = System::builder()
        .backend(Backend::Postgres)
        .store_args(&["--partitions", "32"])
        .coordinator(balanced)
        .coordinators(COORDINATORS)
        .edges(2)
        .fault_links()
        .start()
        .await;
    let mut store = SessionStoreClient::connect(system.store_url())
        .await
        .unwrap();
    for n in 0..COORDINATORS {
        system.coordinators[n]
            .until_serving(Instant::now(), DEADLINE)
            .await;
    }
    for edge in &system.edges {
        until_ready(edge.address, || system.output()).await;
    }
    let urls: Vec<EdgeUrl> = (0..2)
        .map(|e| Arc::new(Mutex::new(system.edge_url(e))))
        .collect();
    let load = Load::start(&urls);
    progress(&load.seen, &load.sessions, 2, || system.output()).await;

    for pod in (0..COORDINATORS).rev() {
        let rolled = Instant::now();
        system.coordinators[pod].process.signal("TERM");
        let exit = system.coordinators[pod].process.wait_exit(DEADLINE).await;
        assert!(
            exit.success(),
            "coordinator {pod}: a planned handover exits 0 ({exit:?}):\n{}",
            system.coordinators[pod].process.output_text()
        );
        system.restart_coordinator(pod).await;
        let ready = system.coordinators[pod]
            .until_serving(rolled, DEADLINE)
            .await;
        // The controller's fixed wait after Ready, not a synchronisation of
        // the test's: this is what a roll does before it stops the next pod.
        tokio::time::sleep(MIN_READY).await;
        let holds = until_holding(&mut store, &system, pod).await;
        clawgate_system_tests::report(&format!(
            "coordinator {pod} rolled: Ready after {} ms, holding {holds} partitions after {} ms",
            ready.as_millis(),
            rolled.elapsed().as_millis()
        ));
        progress(&load.seen, &load.sessions, 1, || system.output()).await;
    }

    // The roll leaves every pod with a share.
    for n in 0..COORDINATORS {
        until_holding(&mut store, &system, n).await;
    }
    progress(&load.seen, &load.sessions, 2, || system.output()).await;
    let figures = load.end_and_check(&system, &runtime).await;
    clawgate_system_tests::report(&figures);
    system.finish().await;
}

//! Chaos: clients keep sending turns, retrying each with its idempotency
//! key through whatever edge answers, while a seeded schedule SIGKILLs and
//! restarts the store, the coordinator leader and an edge, cuts a
//! coordinator's connections to the store and partitions it from the store
//! for longer than its lease (all through TCP proxies in the test). Real
//! processes: one store (the embedded file, or PostgreSQL), two lease-mode
//! coordinators executing through a counting runtime, two edges.
//!
//! Afterwards, with every process healed: no run executed twice (the
//! runtime counts), every acknowledged run has a terminal record, every
//! session's transcript holds each run's turns together, once, in send
//! order, and every run a client saw finish has both its turns.
//!
//! `CHAOS_SEED` picks the schedule (printed), `CHAOS_FAULTS` its length
//! (default 6 per backend; `CHAOS_FAULTS=60` for a longer run).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_system_tests::cluster::Role;
use clawgate_system_tests::fault_proxy::FaultProxy;
use clawgate_system_tests::fuzz_seeds::env_or;
use clawgate_system_tests::ha;
use clawgate_system_tests::process::{Process, binary_path, service_command};
use clawgate_system_tests::records::{is_terminal, run_record};
use clawgate_system_tests::rng::SplitMix;
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::slot::CoordinatorSlot;
use clawgate_system_tests::transcript::{check_send_order, run_blocks};
use clawgate_system_tests::turns::{Conn, attempt};

use store_pb::session_store_client::SessionStoreClient;
use tokio::time::Instant;

const SESSIONS: usize = 6;
/// Store kill, leader kill, edge kill, connection cut, partition.
const FAULT_KINDS: u64 = 5;
/// Longer than the lease: a partitioned leader loses its partitions.
const PARTITION: Duration = Duration::from_millis(3_000);
/// How long the whole run may take after the faults (a broken system
/// fails here instead of hanging).
const DRAIN: Duration = Duration::from_secs(120);

#[derive(Clone)]
enum Backend {
    Embedded(std::path::PathBuf),
    Postgres(String),
}

async fn start_store(backend: &Backend) -> Process {
    match backend {
        Backend::Postgres(schema) => ha::start_pg_store(schema).await,
        Backend::Embedded(file) => {
            let mut command = service_command(binary_path(Role::Store.binary()));
            command
                .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
                .arg("--store")
                .arg(file);
            Process::start(command, Role::Store.binary(), Role::Store.ready_message()).await
        }
    }
}

/// The system under test, and what the faults did to it.
struct System {
    backend: Backend,
    runtime: CountingRuntime,
    store: Process,
    /// Every path to the store goes through one of these: the edges', and
    /// each coordinator's own (`CoordinatorSlot::store_link`).
    edge_store_link: FaultProxy,
    slots: Vec<CoordinatorSlot>,
    edges: Vec<Process>,
    /// The edges' current URLs, for the clients.
    edge_urls: Arc<Mutex<Vec<String>>>,
    faults: HashMap<&'static str, usize>,
}

impl System {
    async fn start(backend: Backend) -> Self {
        let runtime = CountingRuntime::start(Duration::from_millis(100)).await;
        let store = start_store(&backend).await;
        let edge_store_link = FaultProxy::start(store.address).await;
        let mut slots = Vec::new();
        for _ in 0..2 {
            slots.push(CoordinatorSlot::start(store.address, &runtime, &[]).await);
        }
        let coordinators = format!("{},{}", slots[0].front.url(), slots[1].front.url());
        let mut edges = Vec::new();
        for _ in 0..2 {
            edges.push(ha::start_edge(&edge_store_link.url(), &coordinators).await);
        }
        let edge_urls = edges
            .iter()
            .map(|e| format!("ws://{}", e.address))
            .collect();
        Self {
            backend,
            runtime,
            store,
            edge_store_link,
            slots,
            edges,
            edge_urls: Arc::new(Mutex::new(edge_urls)),
            faults: HashMap::new(),
        }
    }

    fn coordinators(&self) -> String {
        format!(
            "{},{}",
            self.slots[0].front.url(),
            self.slots[1].front.url()
        )
    }

    /// The slot whose coordinator serves (holds the partitions), if any.
    async fn leader(&self) -> Option<usize> {
        for (i, slot) in self.slots.iter().enumerate() {
            if ha::serving(&slot.process).await {
                return Some(i);
            }
        }
        None
    }

    async fn restart_store(&mut self, down_for: Duration) {
        self.store.kill().await;
        tokio::time::sleep(down_for).await;
        self.store = start_store(&self.backend).await;
        self.edge_store_link.set_upstream(self.store.address);
        for slot in &self.slots {
            slot.store_link.set_upstream(self.store.address);
        }
    }

    async fn restart_coordinator(&mut self, slot: usize) {
        self.slots[slot].restart(&self.runtime).await;
    }

    async fn restart_edge(&mut self, edge: usize) {
        self.edges[edge].kill().await;
        let coordinators = self.coordinators();
        self.edges[edge] = ha::start_edge(&self.edge_store_link.url(), &coordinators).await;
        self.edge_urls.lock().unwrap()[edge] = format!("ws://{}", self.edges[edge].address);
    }

    /// Restarts any coordinator that stopped by itself (a leader that lost
    /// its lease exits with STALE_OWNER) once it can reach the store again
    /// (one that cannot exits at start, as a pod would until it can).
    async fn heal(&mut self) {
        for slot in 0..self.slots.len() {
            if !self.slots[slot].store_link.is_partitioned() && self.slots[slot].process.exited() {
                *self
                    .faults
                    .entry("coordinator exited, restarted")
                    .or_default() += 1;
                self.restart_coordinator(slot).await;
            }
        }
    }

    /// Injects fault `kind` (0..FAULT_KINDS).
    async fn inject(&mut self, kind: u64, rng: &mut SplitMix) {
        let what = match kind {
            0 => {
                let down_for = rng.millis(100, 800);
                self.restart_store(down_for).await;
                "store SIGKILLed"
            }
            1 => match self.leader().await {
                Some(leader) => {
                    self.restart_coordinator(leader).await;
                    "leader SIGKILLed"
                }
                None => "no leader to kill",
            },
            2 => {
                let edge = rng.below(self.edges.len() as u64) as usize;
                self.restart_edge(edge).await;
                "edge SIGKILLed"
            }
            3 => {
                let slot = rng.below(self.slots.len() as u64) as usize;
                self.slots[slot].store_link.cut();
                "coordinator's store connections cut"
            }
            _ => match self.leader().await {
                Some(leader) => {
                    self.slots[leader].store_link.partition(PARTITION);
                    "leader partitioned from the store"
                }
                None => "no leader to partition",
            },
        };
        clawgate_system_tests::report(&format!("chaos: {what}"));
        *self.faults.entry(what).or_default() += 1;
    }

    fn output(&self) -> String {
        let store = std::iter::once(("store".to_owned(), &self.store));
        let coordinators = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, slot)| (format!("coordinator {i}"), &slot.process));
        let edges = self
            .edges
            .iter()
            .enumerate()
            .map(|(i, edge)| (format!("edge {i}"), edge));
        ha::logs(store.chain(coordinators).chain(edges))
    }
}

/// How a client saw one of its runs.
#[derive(Debug, Clone)]
struct Sent {
    run_id: String,
    /// An ACK (`ok: true`) came for it.
    acknowledged: bool,
    /// The run's end as the client saw it (`final`, `error`, `aborted`).
    ended: String,
}

#[derive(Default)]
struct Journal {
    runs: Mutex<HashMap<usize, Vec<Sent>>>,
    retries: AtomicUsize,
}

/// A session's client: one run after another until `stop`, each retried
/// (same key, any edge) until the client saw its end.
async fn client(
    session: usize,
    urls: Arc<Mutex<Vec<String>>>,
    journal: Arc<Journal>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let key = format!("chaos-{session}");
    let mut conn: Option<Conn> = None;
    let mut pick = session;
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let run_id = format!("{key}-{i}");
        let mut acked = false;
        let deadline = Instant::now() + DRAIN;
        let mut last_error = String::new();
        let ended = loop {
            if Instant::now() > deadline {
                return Err(format!("{run_id} never ended; last: {last_error}"));
            }
            if conn.is_none() {
                pick += 1;
                let url = {
                    let urls = urls.lock().unwrap();
                    urls[pick % urls.len()].clone()
                };
                match Conn::open(&url).await {
                    Ok(open) => conn = Some(open),
                    Err(error) => last_error = format!("{url}: {error}"),
                }
            }
            let result = match conn.as_mut() {
                Some(open) => attempt(open, &key, &run_id, "followup", &mut acked).await,
                None => Err(format!("no edge answered ({last_error})")),
            };
            match result {
                Ok(ended) => break ended,
                Err(error) => {
                    last_error = error;
                    conn = None;
                    journal.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        journal
            .runs
            .lock()
            .unwrap()
            .entry(session)
            .or_default()
            .push(Sent {
                run_id,
                acknowledged: acked,
                ended,
            });
    }
    unreachable!("the loop only returns")
}

async fn chaos(backend: Backend) {
    let seed: u64 = env_or("CHAOS_SEED", 0xc4a0_5eed);
    let faults: usize = env_or("CHAOS_FAULTS", 6);
    clawgate_system_tests::report(&format!("chaos: seed {seed}, {faults} faults"));
    let mut rng = SplitMix(seed);
    let mut system = System::start(backend).await;
    let journal = Arc::new(Journal::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..SESSIONS)
        .map(|s| {
            tokio::spawn(client(
                s,
                system.edge_urls.clone(),
                journal.clone(),
                stop.clone(),
            ))
        })
        .collect();
    // The kinds in a shuffled cycle: every kind comes once in each
    // FAULT_KINDS faults.
    let mut cycle: Vec<u64> = Vec::new();
    for _ in 0..faults {
        if cycle.is_empty() {
            cycle = (0..FAULT_KINDS).collect();
            for i in (1..cycle.len()).rev() {
                cycle.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        tokio::time::sleep(rng.millis(800, 2_000)).await;
        system.heal().await;
        let kind = cycle.pop().expect("refilled above");
        system.inject(kind, &mut rng).await;
    }
    // Healed: every coordinator running and one of them leading.
    let healed = Instant::now() + DRAIN;
    loop {
        system.heal().await;
        if system.leader().await.is_some() {
            break;
        }
        assert!(
            Instant::now() < healed,
            "no leader after the faults:\n{}",
            system.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A last stretch without faults, then the clients finish their runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let outcome = match tokio::time::timeout(DRAIN, client).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panicked)) => Err(panicked.to_string()),
            Err(_) => Err("timed out".into()),
        };
        if let Err(e) = outcome {
            panic!("a client failed: {e}\n{}", system.output());
        }
    }
    check(&system, &journal).await;
    drop(system);
}

async fn check(system: &System, journal: &Journal) {
    let executions = system.runtime.executions();
    let duplicates: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    let mut store = SessionStoreClient::connect(system.edge_store_link.url())
        .await
        .unwrap();
    let runs = journal.runs.lock().unwrap().clone();
    let mut lost_acks = Vec::new();
    let mut statuses: HashMap<String, usize> = HashMap::new();
    // Runs that ended without finishing (their coordinator lost, killed or
    // superseded) but whose answer is in the transcript: a write that
    // landed after its writer lost the session.
    let mut stale_appends = Vec::new();
    for (session, sent) in &runs {
        let mut unfinished = Vec::new();
        for run in sent {
            let record = run_record(&mut store, &run.run_id).await;
            let Some(record) = record else {
                if run.acknowledged {
                    lost_acks.push(run.run_id.clone());
                }
                continue;
            };
            let status = store_pb::RunStatus::try_from(record.status).unwrap();
            *statuses.entry(format!("{status:?}")).or_default() += 1;
            use store_pb::RunStatus as S;
            assert!(
                is_terminal(status),
                "{}: not terminal ({status:?})",
                run.run_id
            );
            if run.ended == "final" {
                assert_eq!(status, S::Ok, "{}: the client saw it finish", run.run_id);
            }
            if matches!(status, S::Lost | S::Superseded) {
                unfinished.push(run.run_id.clone());
            }
        }
        // The transcript: each run's turns together, once, in send order;
        // a run the client saw finish has its user and assistant turns.
        let blocks = run_blocks(&mut store, &format!("chaos-{session}")).await;
        let sent_order: Vec<&str> = sent.iter().map(|r| r.run_id.as_str()).collect();
        if let Err(e) = check_send_order(&blocks, &sent_order) {
            panic!("chaos-{session}: {e}");
        }
        stale_appends.extend(
            blocks
                .iter()
                .filter(|(id, roles)| unfinished.contains(id) && roles.len() > 1)
                .map(|(id, _)| id.clone()),
        );
        for run in sent.iter().filter(|r| r.ended == "final") {
            assert!(
                blocks
                    .iter()
                    .any(|(id, roles)| *id == run.run_id && roles.len() == 2),
                "{}: finished, but its turns are not in the transcript",
                run.run_id
            );
        }
    }
    let total: usize = runs.values().map(Vec::len).sum();
    let kills: usize = system
        .faults
        .iter()
        .filter(|(what, _)| what.contains("SIGKILL"))
        .map(|(_, n)| n)
        .sum();
    clawgate_system_tests::report(&format!(
        "chaos: runs {total}, kills {kills}, faults {:?}, retries {}, record statuses {statuses:?}, \
         duplicates {}, lost acks {}, stale-writer appends {}",
        system.faults,
        journal.retries.load(Ordering::Relaxed),
        duplicates.len(),
        lost_acks.len(),
        stale_appends.len()
    ));
    assert!(
        stale_appends.is_empty(),
        "answers of runs that lost their session were written: {stale_appends:?}"
    );
    assert!(
        duplicates.is_empty(),
        "runs executed more than once: {duplicates:?}"
    );
    assert!(
        lost_acks.is_empty(),
        "acknowledged runs without a record: {lost_acks:?}"
    );
    assert!(total >= SESSIONS, "the clients got nothing done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    chaos(Backend::Embedded(dir.path().join("store.redb"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgres() {
    let schema = format!("chaos_{}", uuid::Uuid::new_v4().simple());
    chaos(Backend::Postgres(schema.clone())).await;
    session_store::backend::postgres::drop_schema(&ha::postgres_url(), &schema)
        .await
        .expect("drop the test's schema");
}

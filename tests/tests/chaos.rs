//! Chaos: clients keep sending turns, retrying each with its idempotency
//! key through whatever edge answers, while a seeded schedule breaks the
//! system. Real processes: one store (the embedded file, or PostgreSQL in
//! a cluster of the test's own), two lease-mode coordinators executing
//! through a counting runtime, two edges; every path between them through
//! a fault proxy in the test.
//!
//! The faults, every kind once in each shuffled cycle:
//! - the store SIGKILLed and restarted on the same file or schema; the
//!   leader SIGKILLed; an edge SIGKILLed;
//! - a coordinator's store connections cut; the leader partitioned from
//!   the store (refused) past its lease;
//! - a link silent (a blackhole: nothing refused or reset, no byte moves)
//!   past the lease: edge → leader, leader → store, edges → store;
//! - the leader SIGSTOPped past its lease, then SIGCONT; an edge
//!   SIGSTOPped, then SIGCONT;
//! - on PostgreSQL also: PostgreSQL SIGKILLed (postmaster and backends)
//!   and restarted; the store's connections to it cut; the store's link to
//!   it silent; PostgreSQL SIGSTOPped; each silence and pause past the
//!   lease and the store's operation timeout.
//!
//! After each fault heals, two bounds: every run acknowledged before it
//! has a terminal record within [`RUNS_END`], and a new run in a new
//! session finishes within [`SERVING_AGAIN`] (the system serves again).
//! Afterwards: `Journal::check` (no run executed twice, no acknowledged
//! run lost, every record terminal, transcripts in send order and as the
//! runs' ends say).
//!
//! `CHAOS_SEED` picks the schedule (printed), `CHAOS_FAULTS` its length
//! (default: each kind once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::fault_proxy::FaultProxy;
use clawgate_system_tests::fuzz_seeds::env_or;
use clawgate_system_tests::journal::{Journal, client};
use clawgate_system_tests::pg_cluster::PgCluster;
use clawgate_system_tests::records::{is_terminal, try_run_record};
use clawgate_system_tests::report;
use clawgate_system_tests::rng::SplitMix;
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::sandbox::Backend;
use clawgate_system_tests::system::{CoordinatorSpec, Runtime, System};
use clawgate_system_tests::turns::{Link, attempt};
use clawgate_system_tests::wait::poll;
use tokio::time::Instant;

const SESSIONS: usize = 6;
/// Longer than the lease (the kit's 2 s TTL): a leader cut off, silent or
/// paused that long loses its partitions.
const OUTAGE: Duration = Duration::from_millis(3_000);
/// The store's operation timeout, shorter than an outage: a silent or
/// paused database costs each call this long, then UNAVAILABLE.
const STORE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// Every run acknowledged before a fault is terminal this long after the
/// fault healed: the lease TTL, a takeover, recovery and a restarted
/// process, with a wide margin for a loaded machine.
const RUNS_END: Duration = Duration::from_secs(30);
/// A new run finishes this long after a fault healed.
const SERVING_AGAIN: Duration = Duration::from_secs(30);
/// How long the whole run may take after the faults (a broken system
/// fails here instead of hanging).
const DRAIN: Duration = Duration::from_secs(120);

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillStore,
    KillLeader,
    KillEdge,
    CutCoordinatorStoreLinks,
    PartitionLeader,
    SilenceEdgeToLeader,
    SilenceLeaderToStore,
    SilenceEdgesToStore,
    PauseLeader,
    PauseEdge,
    KillPostgres,
    CutPostgresLinks,
    SilencePostgresLink,
    PausePostgres,
}

impl Fault {
    const ANY_STORE: [Fault; 10] = [
        Fault::KillStore,
        Fault::KillLeader,
        Fault::KillEdge,
        Fault::CutCoordinatorStoreLinks,
        Fault::PartitionLeader,
        Fault::SilenceEdgeToLeader,
        Fault::SilenceLeaderToStore,
        Fault::SilenceEdgesToStore,
        Fault::PauseLeader,
        Fault::PauseEdge,
    ];
    const POSTGRES: [Fault; 4] = [
        Fault::KillPostgres,
        Fault::CutPostgresLinks,
        Fault::SilencePostgresLink,
        Fault::PausePostgres,
    ];

    fn kinds(backend: Backend) -> Vec<Fault> {
        let mut kinds = Self::ANY_STORE.to_vec();
        if backend == Backend::Postgres {
            kinds.extend(Self::POSTGRES);
        }
        kinds
    }
}

/// PostgreSQL of the test's own, and the store's link to it.
struct Database {
    cluster: PgCluster,
    link: FaultProxy,
}

/// The system under test and what the faults did to it.
struct Chaos {
    system: System,
    database: Option<Database>,
    runtime: CountingRuntime,
    /// The edges' current URLs, for the clients.
    edge_urls: Arc<Mutex<Vec<String>>>,
    /// Per fault: how many, and the longest time to each bound after it.
    faults: HashMap<String, (usize, Duration, Duration)>,
    probes: usize,
}

impl Chaos {
    async fn start(backend: Backend) -> Self {
        let runtime = CountingRuntime::start(Duration::from_millis(100)).await;
        let lease = CoordinatorSpec::lease(Runtime::Grpc(runtime.url()), Duration::from_secs(2));
        let mut builder = System::builder()
            .store_args(&["--operation-timeout", &millis(STORE_TIMEOUT)])
            .coordinator(lease)
            .coordinators(2)
            .edges(2)
            .fault_links();
        let database = match backend {
            Backend::Postgres => {
                let cluster = PgCluster::start().await;
                let server = format!("127.0.0.1:{}", cluster.port).parse().unwrap();
                let link = FaultProxy::start(server).await;
                let url = format!("postgres://postgres@{}/postgres", link.address);
                builder = builder.postgres_at(url);
                Some(Database { cluster, link })
            }
            _ => None,
        };
        let system = builder.backend(backend).start().await;
        let edge_urls = Arc::new(Mutex::new(system.edge_urls()));
        Self {
            system,
            database,
            runtime,
            edge_urls,
            faults: HashMap::new(),
            probes: 0,
        }
    }

    fn database(&mut self) -> &mut Database {
        self.database
            .as_mut()
            .expect("a PostgreSQL fault on PostgreSQL")
    }

    async fn restart_edge(&mut self, edge: usize) {
        self.system.restart_edge(edge).await;
        self.edge_urls.lock().unwrap()[edge] = self.system.edge_url(edge);
    }

    /// Restarts any coordinator that stopped by itself (one that lost its
    /// lease exits with STALE_OWNER) once it can reach the store, as its
    /// pod would be (one that cannot exits at start until it can).
    async fn heal(&mut self) {
        for n in 0..self.system.coordinators.len() {
            let coordinator = &mut self.system.coordinators[n];
            let link = coordinator.store_link();
            let reachable = !link.is_partitioned() && !link.is_silent();
            if reachable && coordinator.process.exited() {
                self.system.restart_coordinator(n).await;
            }
        }
    }

    /// The leader, once one serves.
    async fn leader(&mut self) -> usize {
        let found = poll("a leader", DRAIN, async || {
            self.heal().await;
            self.system.leader().await
        })
        .await;
        found.unwrap_or_else(|timed_out| panic!("{timed_out}:\n{}", self.system.output()))
    }

    /// Injects `fault` and holds it until it heals (an outage lasts
    /// [`OUTAGE`]).
    async fn inject(&mut self, fault: Fault, rng: &mut SplitMix) {
        match fault {
            Fault::KillStore => self.system.restart_store(rng.millis(100, 800)).await,
            Fault::KillLeader => {
                let leader = self.leader().await;
                self.system.restart_coordinator(leader).await;
            }
            Fault::KillEdge => {
                let edge = rng.below(self.system.edges.len() as u64) as usize;
                self.restart_edge(edge).await;
            }
            Fault::CutCoordinatorStoreLinks => {
                let n = rng.below(self.system.coordinators.len() as u64) as usize;
                self.system.coordinators[n].store_link().cut();
            }
            Fault::PartitionLeader => {
                let leader = self.leader().await;
                self.system.coordinators[leader]
                    .store_link()
                    .partition(OUTAGE);
                tokio::time::sleep(OUTAGE).await;
            }
            Fault::SilenceEdgeToLeader => {
                let leader = self.leader().await;
                silent_for(self.system.coordinators[leader].front()).await;
            }
            Fault::SilenceLeaderToStore => {
                let leader = self.leader().await;
                silent_for(self.system.coordinators[leader].store_link()).await;
            }
            Fault::SilenceEdgesToStore => silent_for(self.system.edge_store_link()).await,
            Fault::PauseLeader => {
                let leader = self.leader().await;
                let process = &self.system.coordinators[leader].process;
                process.signal("STOP");
                tokio::time::sleep(OUTAGE).await;
                process.signal("CONT");
            }
            Fault::PauseEdge => {
                let edge = rng.below(self.system.edges.len() as u64) as usize;
                self.system.edges[edge].signal("STOP");
                tokio::time::sleep(OUTAGE).await;
                self.system.edges[edge].signal("CONT");
            }
            Fault::KillPostgres => {
                let database = self.database();
                database.cluster.kill().await;
                tokio::time::sleep(rng.millis(100, 800)).await;
                database.cluster.restart().await;
            }
            Fault::CutPostgresLinks => self.database().link.cut(),
            Fault::SilencePostgresLink => silent_for(&self.database().link).await,
            Fault::PausePostgres => {
                let database = self.database();
                database.cluster.pause();
                tokio::time::sleep(OUTAGE).await;
                database.cluster.resume();
            }
        }
    }

    /// After a fault healed at `healed`: every run acknowledged before it
    /// ends, and a new one finishes, each within its bound. The times
    /// taken.
    async fn bounds_after(
        &mut self,
        fault: Fault,
        journal: &Journal,
        healed: Instant,
    ) -> (Duration, Duration) {
        let acknowledged = journal.acknowledged_in_flight();
        let mut store = SessionStoreClient::connect(self.system.edge_store_url())
            .await
            .unwrap();
        for run in &acknowledged {
            let ended = poll(
                format!("{run} to end after the fault"),
                RUNS_END,
                async || {
                    self.heal().await;
                    match try_run_record(&mut store, run).await {
                        Ok(Some(record)) if is_terminal(record.status()) => Ok(()),
                        Ok(other) => Err(format!("{:?}", other.map(|r| r.status()))),
                        Err(refused) => Err(format!("the store refused: {refused}")),
                    }
                },
            )
            .await;
            if let Err(timed_out) = ended {
                panic!("after {fault:?}: {timed_out}:\n{}", self.system.output());
            }
        }
        let runs_ended = healed.elapsed();
        self.probes += 1;
        let session = format!("chaos-probe-{}", self.probes);
        let mut link = Link::new(self.edge_urls.clone(), self.probes);
        let mut attempt_n = 0;
        let served = poll(
            "a new run to finish after the fault",
            SERVING_AGAIN,
            async || {
                self.heal().await;
                // A run the fault's aftermath ended early (lost with a
                // coordinator that stopped) does not count: another is sent.
                let run_id = format!("{session}-{attempt_n}");
                let mut acked = false;
                let ended = match link.conn().await {
                    Ok(open) => attempt(open, &session, &run_id, "followup", &mut acked).await,
                    Err(error) => Err(error),
                };
                match ended {
                    Ok(end) if end == "final" => Ok(()),
                    Ok(end) => {
                        attempt_n += 1;
                        Err(format!("{run_id} ended {end}"))
                    }
                    Err(error) => {
                        link.failed();
                        Err(error)
                    }
                }
            },
        )
        .await;
        if let Err(timed_out) = served {
            panic!("after {fault:?}: {timed_out}:\n{}", self.system.output());
        }
        (runs_ended, healed.elapsed())
    }
}

fn millis(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// Silences `link` for [`OUTAGE`], then heals it.
async fn silent_for(link: &FaultProxy) {
    link.silence();
    tokio::time::sleep(OUTAGE).await;
    link.heal();
}

async fn chaos(backend: Backend) {
    let kinds = Fault::kinds(backend);
    let seed: u64 = env_or("CHAOS_SEED", 0xc4a0_5eed);
    let faults: usize = env_or("CHAOS_FAULTS", kinds.len());
    report(&format!(
        "chaos on {backend:?}: seed {seed}, {faults} faults"
    ));
    let mut rng = SplitMix(seed);
    let mut chaos = Chaos::start(backend).await;
    let journal = Arc::new(Journal::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let urls = chaos.edge_urls.clone();
            let session = format!("chaos-{s}");
            tokio::spawn(client(
                session,
                s,
                urls,
                journal.clone(),
                stop.clone(),
                DRAIN,
            ))
        })
        .collect();
    let mut cycle: Vec<Fault> = Vec::new();
    for _ in 0..faults {
        if cycle.is_empty() {
            cycle = kinds.clone();
            for i in (1..cycle.len()).rev() {
                cycle.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        tokio::time::sleep(rng.millis(500, 1_500)).await;
        chaos.heal().await;
        let fault = cycle.pop().expect("refilled above");
        let before = journal.ended();
        chaos.inject(fault, &mut rng).await;
        let healed = Instant::now();
        let (runs_ended, served) = chaos.bounds_after(fault, &journal, healed).await;
        report(&format!(
            "chaos: {fault:?}: acknowledged runs ended {runs_ended:.1?} and a new run \
             finished {served:.1?} after it healed ({} runs ended meanwhile)",
            journal.ended() - before
        ));
        let entry = chaos.faults.entry(format!("{fault:?}")).or_default();
        *entry = (entry.0 + 1, entry.1.max(runs_ended), entry.2.max(served));
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
            panic!("a client failed: {e}\n{}", chaos.system.output());
        }
    }
    let mut store = SessionStoreClient::connect(chaos.system.edge_store_url())
        .await
        .unwrap();
    let summary = journal.check(&mut store, &chaos.runtime.executions()).await;
    report(&format!(
        "chaos on {backend:?}: {summary:?}; per fault (count, longest to runs ended, \
         longest to serving): {:?}",
        chaos.faults
    ));
    assert!(summary.runs >= SESSIONS, "the clients got nothing done");
    assert!(
        chaos.faults.len() == kinds.len().min(faults),
        "every kind of fault came: {:?}",
        chaos.faults.keys()
    );
    chaos.system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_the_embedded_store() {
    chaos(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgres() {
    chaos(Backend::Postgres).await;
}

//! `clawgate-bench scale`: complete runs per second with 1, 2, 3, …
//! coordinators sharing one store's partitions, the runtime the bottleneck.
//!
//! For each coordinator count N it starts, from `--bin-dir`, one
//! `session-store` on a fresh store, N `run-coordinator`s at once with
//! `--ownership lease --placement balanced` (each on port 0, so each
//! advertises its own `http://127.0.0.1:<port>`), a small `--max-executing`
//! and the echo runtime paced so that a run takes a while; and then, once
//! the store's lease table shows every partition live and placed where
//! rendezvous hashing over the N owners puts it (placement has converged,
//! no move in progress), the edges, each given all N addresses.
//!
//! Then:
//!
//! 1. `alone`: one connection sends runs one after the other on a session
//!    of its own, nothing else running; the median is one run's time, and
//!    the ideal rate is N × the cap ÷ that time;
//! 2. the load: `--sessions` connections (spread over the edges in turn),
//!    each on a session of its own sending run after run (`chat.send` →
//!    its `chat` final, the next send when it ended; `followup` turns), for
//!    `--warmup`, then `--duration` measured: a run counts when it ends in
//!    the measured window, its latency send → final, and runs per second
//!    are those runs over the window. The machine's CPU is read at the
//!    window's ends (`/proc/stat`, and each process's `/proc/<pid>/stat`).
//!
//! A session's partition is the FNV hash of its canonical key, the
//! partition's owner whatever the lease table says: the report shows how
//! many partitions and load sessions each coordinator had. With at least
//! `--max-executing` sessions on every coordinator, each keeps its cap
//! busy, and the rate is bound by the runtime, not the share.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clawgate_common::partition::{partition_of, rendezvous_owner};
use clawgate_common::process::Process;
use clawgate_proto::session_store::v1 as store_pb;
use serde_json::json;
use session_store_api::key::SessionKey;
use store_pb::session_store_client::SessionStoreClient;
use tokio::time::Instant;

use crate::client::Client;
use crate::procs::{
    COORDINATOR_READY, EDGE_READY, START_TIMEOUT, STORE_READY, Settings, coordinator_command,
    cpu_ticks, edge_command, machine_ticks, start_service, stop_service, store_command,
    until_ready,
};
use crate::scenarios::connect_many;
use crate::stats::Stats;
use crate::stores::Backend;

/// What `scale` runs.
#[derive(Debug, Clone)]
pub struct ScalePlan {
    /// Where session-store, run-coordinator and gateway-edge are.
    pub bin_dir: PathBuf,
    pub backend: Backend,
    /// The coordinator counts, one system each.
    pub coordinators: Vec<usize>,
    pub edges: usize,
    /// Load connections, each on a session of its own.
    pub sessions: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Runs `alone` measures.
    pub alone_runs: usize,
    /// The store's `--partitions` (`None`: its default).
    pub partitions: Option<u32>,
    pub lease_ttl: Duration,
    pub lease_renew: Duration,
    /// The echo's pacing, the token, the edge's limits and the cap (which
    /// must be set: the ideal is computed from it).
    pub settings: Settings,
    /// Prefix of the session keys.
    pub session_prefix: String,
}

impl ScalePlan {
    fn cap(&self) -> usize {
        self.settings.max_executing.unwrap_or(16)
    }
}

/// Shares of the machine's CPU time during the measured window (1.0: every
/// core busy all the time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuShare {
    /// Everything that ran (other jobs too).
    pub machine: f64,
    /// The store, the coordinators and the edges.
    pub services: f64,
    /// This process (the load's clients).
    pub bench: f64,
}

/// What one coordinator count measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Live partitions per coordinator, in start order.
    pub partitions: Vec<usize>,
    /// Load sessions per coordinator, in start order.
    pub sessions: Vec<usize>,
    /// The median of the runs `alone` measured.
    pub alone: Duration,
    /// The runs that ended in the measured window, their rate over it.
    pub load: Stats,
    pub cpu: Option<CpuShare>,
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleRow {
    pub coordinators: usize,
    /// Why it could not be measured, if it could not.
    pub outcome: Result<Measured, String>,
}

/// Every coordinator count of `plan`, one after the other.
pub async fn run(plan: &ScalePlan) -> Vec<ScaleRow> {
    let mut rows = Vec::new();
    for &n in &plan.coordinators {
        eprintln!("{n} coordinators on {}", plan.backend.name());
        let outcome = on_fresh_store(plan, n).await.map_err(|e| format!("{e:#}"));
        if let Err(error) = &outcome {
            eprintln!("  {n} coordinators: {error}");
        }
        rows.push(ScaleRow {
            coordinators: n,
            outcome,
        });
    }
    rows
}

async fn on_fresh_store(plan: &ScalePlan, n: usize) -> anyhow::Result<Measured> {
    let store = plan.backend.fresh().await?;
    let measured = async {
        let cluster = Cluster::start(plan, n, &store.location).await?;
        let measured = measure(plan, &cluster).await;
        if let Err(e) = &measured {
            eprintln!("{e:#}; the services' output:\n{}", cluster.output());
        }
        let stopped = cluster.stop().await;
        let measured = measured?;
        if let Err(e) = stopped {
            eprintln!("warning: {e:#}");
        }
        anyhow::Ok(measured)
    }
    .await;
    if let Err(e) = store.remove().await {
        eprintln!("warning: removing the store: {e:#}");
    }
    measured
}

/// One store, N balanced coordinators, the edges.
struct Cluster {
    store: Process,
    coordinators: Vec<Process>,
    edges: Vec<Process>,
    /// The lease table once placement converged.
    leases: store_pb::ListLeasesResponse,
}

impl Cluster {
    async fn start(plan: &ScalePlan, n: usize, store: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(n > 0, "a coordinator count is positive");
        let partitions = plan.partitions.map(|p| p.to_string());
        let extra: Vec<&str> = match &partitions {
            Some(p) => vec!["--partitions", p],
            None => Vec::new(),
        };
        let command = store_command(&plan.bin_dir, store, &extra)?;
        let mut cluster = Self {
            store: start_service(command, "session-store", STORE_READY).await?,
            coordinators: Vec::new(),
            edges: Vec::new(),
            leases: store_pb::ListLeasesResponse::default(),
        };
        if let Err(e) = cluster.fill(plan, n).await {
            eprintln!("{e:#}; the services' output:\n{}", cluster.output());
            if let Err(stop) = cluster.stop().await {
                eprintln!("warning: {stop:#}");
            }
            return Err(e);
        }
        Ok(cluster)
    }

    /// Starts the coordinators together (so that each sees the others at
    /// its first round and takes only its share), waits for the spread,
    /// then starts the edges and waits for their `/readyz`.
    async fn fill(&mut self, plan: &ScalePlan, n: usize) -> anyhow::Result<()> {
        let store_url = self.store.url();
        let ttl = format!("{}ms", plan.lease_ttl.as_millis());
        let renew = format!("{}ms", plan.lease_renew.as_millis());
        let mut starts = Vec::new();
        for index in 0..n {
            let mut command = coordinator_command(&plan.bin_dir, &store_url, &plan.settings)?;
            command
                .args(["--ownership", "lease", "--placement", "balanced"])
                .args(["--lease-ttl", &ttl, "--lease-renew-interval", &renew])
                .args(["--drain-timeout", "5s"]);
            let name = format!("run-coordinator-{index}");
            starts.push(async move { start_service(command, &name, COORDINATOR_READY).await });
        }
        for started in futures::future::join_all(starts).await {
            self.coordinators.push(started?);
        }
        let urls: Vec<String> = self.coordinators.iter().map(Process::url).collect();
        self.leases = until_spread(&store_url, &urls).await?;
        for index in 0..plan.edges.max(1) {
            let command = edge_command(&plan.bin_dir, &urls.join(","), &store_url, &plan.settings)?;
            let name = format!("gateway-edge-{index}");
            let edge = start_service(command, &name, EDGE_READY).await?;
            self.edges.push(edge);
            let edge = self.edges.last().expect("just started");
            until_ready(edge.address).await?;
        }
        Ok(())
    }

    fn services(&self) -> impl Iterator<Item = &Process> {
        std::iter::once(&self.store)
            .chain(&self.coordinators)
            .chain(&self.edges)
    }

    fn output(&self) -> String {
        self.services()
            .map(|s| format!("==== {} ====\n{}", s.name, s.output_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The live partitions of each coordinator, in start order.
    fn partitions(&self) -> Vec<usize> {
        let holders = holders(&self.leases);
        self.coordinators
            .iter()
            .map(|c| holders.get(&c.url()).map_or(0, |h| h.len()))
            .collect()
    }

    /// Which coordinator (by start order) owns `session`.
    fn owner_of(&self, session: &str) -> anyhow::Result<usize> {
        let key = SessionKey::parse(session).map_err(|e| anyhow::anyhow!("{e}"))?;
        let partition = partition_of(key.as_str(), self.leases.partition_count);
        let lease = self
            .leases
            .leases
            .iter()
            .find(|l| l.partition == partition)
            .with_context(|| format!("no lease for partition {partition}"))?;
        self.coordinators
            .iter()
            .position(|c| c.url() == lease.address)
            .with_context(|| format!("partition {partition} is held at {}", lease.address))
    }

    /// The CPU ticks of every service so far.
    fn cpu_ticks(&self) -> anyhow::Result<u64> {
        self.services()
            .map(|s| Ok(cpu_ticks(s.pid().context("a service's pid")?)?))
            .sum()
    }

    /// The edges first, then the coordinators together (none hands its
    /// partitions to another that is stopping too), then the store.
    async fn stop(self) -> anyhow::Result<()> {
        let mut result = Ok(());
        for edge in self.edges {
            if let Err(e) = stop_service(edge).await {
                result = Err(e);
            }
        }
        let stops = self.coordinators.into_iter().map(stop_service);
        for stopped in futures::future::join_all(stops).await {
            if let Err(e) = stopped {
                result = Err(e);
            }
        }
        if let Err(e) = stop_service(self.store).await {
            result = Err(e);
        }
        result
    }
}

/// The partitions each owner address holds live.
fn holders(table: &store_pb::ListLeasesResponse) -> HashMap<String, Vec<&store_pb::Lease>> {
    let mut holders: HashMap<String, Vec<&store_pb::Lease>> = HashMap::new();
    for lease in &table.leases {
        if lease.owner.is_some() && lease.expires_at_ms > table.now_ms {
            holders
                .entry(lease.address.clone())
                .or_default()
                .push(lease);
        }
    }
    holders
}

/// Whether placement has converged on `coordinators`: every partition
/// held live, by exactly those addresses, each partition by the owner
/// rendezvous hashing over the owners picks (so no move is pending).
pub fn spread_over(table: &store_pb::ListLeasesResponse, coordinators: &[String]) -> bool {
    let holders = holders(table);
    let held: usize = holders.values().map(Vec::len).sum();
    let expected: HashSet<&str> = coordinators.iter().map(String::as_str).collect();
    let addresses: HashSet<&str> = holders.keys().map(String::as_str).collect();
    if held != table.partition_count as usize || held != table.leases.len() || addresses != expected
    {
        return false;
    }
    let owners: HashSet<&str> = table
        .leases
        .iter()
        .filter_map(|l| l.owner.as_deref())
        .collect();
    let owners: Vec<&str> = owners.into_iter().collect();
    owners.len() == coordinators.len()
        && table
            .leases
            .iter()
            .all(|l| rendezvous_owner(l.partition, &owners) == l.owner.as_deref())
}

/// Polls the store's `ListLeases` until placement converged on
/// `coordinators` (see [`spread_over`]).
async fn until_spread(
    store_url: &str,
    coordinators: &[String],
) -> anyhow::Result<store_pb::ListLeasesResponse> {
    let mut client = SessionStoreClient::connect(store_url.to_owned())
        .await
        .with_context(|| format!("connecting to the store at {store_url}"))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let table = client
            .list_leases(store_pb::ListLeasesRequest {})
            .await
            .context("ListLeases")?
            .into_inner();
        if spread_over(&table, coordinators) {
            return Ok(table);
        }
        if Instant::now() > deadline {
            let counts: HashMap<String, usize> = holders(&table)
                .into_iter()
                .map(|(address, leases)| (address, leases.len()))
                .collect();
            bail!(
                "the {} partitions did not spread over {coordinators:?} within \
                 {START_TIMEOUT:?}: {counts:?}",
                table.partition_count
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A user message the echo streams back in exactly `chunks` pieces (it
/// splits a message into pieces of ⌈length ÷ chunks⌉ characters).
fn message(chunks: usize, n: usize) -> String {
    let length = chunks.max(1) * 8;
    let mut text = format!("scale run {n} ");
    text.extend(std::iter::repeat_n('.', length));
    text.chars().take(length).collect()
}

fn send_params(session: &str, run_id: &str, text: String) -> serde_json::Value {
    json!({
        "sessionKey": session, "message": text,
        "idempotencyKey": run_id, "queueMode": "followup",
    })
}

async fn measure(plan: &ScalePlan, cluster: &Cluster) -> anyhow::Result<Measured> {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("{}-scale-{}", plan.session_prefix, &tag[..8]);
    let chunks = plan.settings.echo.chunks;
    let urls: Vec<String> = cluster
        .edges
        .iter()
        .map(|e| format!("ws://{}", e.address))
        .collect();
    let token = &plan.settings.token;

    // One run at a time, nothing else running.
    let (mut alone_client, _) = Client::connect(&urls[0], token).await?;
    let session = format!("{prefix}-alone");
    let mut alone = Vec::new();
    // The first is not counted: the edge may still be learning the owners.
    for n in 0..=plan.alone_runs.max(1) {
        let run_id = format!("{session}-{n}");
        let params = send_params(&session, &run_id, message(chunks, n));
        let took = alone_client.send_run(&run_id, params).await?.1;
        if n > 0 {
            alone.push(took);
        }
    }
    drop(alone_client);
    let alone = Stats::of(alone, Duration::from_secs(1)).p50;

    let sessions: Vec<String> = (0..plan.sessions)
        .map(|index| format!("{prefix}-{index}"))
        .collect();
    let mut per_coordinator = vec![0; cluster.coordinators.len()];
    for session in &sessions {
        per_coordinator[cluster.owner_of(session)?] += 1;
    }
    let mut clients = Vec::with_capacity(plan.sessions);
    for (edge, url) in urls.iter().enumerate() {
        let count = (edge..plan.sessions).step_by(urls.len()).count();
        let opened = connect_many(url, token, count, &Default::default(), |_| {
            Default::default()
        })
        .await?;
        clients.extend(opened.into_iter().map(|(client, _)| client));
    }

    eprintln!(
        "  load: {} sessions, {:?} warm-up, {:?} measured",
        plan.sessions, plan.warmup, plan.duration
    );
    let begins = Instant::now() + plan.warmup;
    let ends = begins + plan.duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .zip(sessions)
        .map(|(client, session)| tokio::spawn(session_loop(client, session, chunks, begins, ends)))
        .collect();
    tokio::time::sleep_until(begins).await;
    let before = cpu_snapshot(cluster);
    tokio::time::sleep_until(ends).await;
    let after = cpu_snapshot(cluster);
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await??);
    }
    let cpu = match (before, after) {
        (Ok(before), Ok(after)) => Some(before.share_until(&after)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("warning: no CPU figures: {e:#}");
            None
        }
    };
    Ok(Measured {
        partitions: cluster.partitions(),
        sessions: per_coordinator,
        alone,
        load: Stats::of(samples, plan.duration),
        cpu,
    })
}

/// One load session: run after run until `ends`; the latency of each run
/// that ended in `[begins, ends)`.
async fn session_loop(
    mut client: Client,
    session: String,
    chunks: usize,
    begins: Instant,
    ends: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::new();
    for n in 0.. {
        let sent = Instant::now();
        if sent >= ends {
            break;
        }
        let run_id = format!("{session}-{n}");
        let params = send_params(&session, &run_id, message(chunks, n));
        let (_, took) = client.send_run(&run_id, params).await?;
        let ended = sent + took;
        if ended >= begins && ended < ends {
            samples.push(took);
        }
    }
    Ok(samples)
}

/// CPU ticks at one moment: the machine's (busy, total), the services',
/// this process's.
struct CpuSnapshot {
    machine: (u64, u64),
    services: u64,
    bench: u64,
}

fn cpu_snapshot(cluster: &Cluster) -> anyhow::Result<CpuSnapshot> {
    Ok(CpuSnapshot {
        machine: machine_ticks()?,
        services: cluster.cpu_ticks()?,
        bench: cpu_ticks(std::process::id())?,
    })
}

impl CpuSnapshot {
    fn share_until(&self, later: &CpuSnapshot) -> CpuShare {
        let total = later.machine.1.saturating_sub(self.machine.1).max(1) as f64;
        let part = |from: u64, to: u64| to.saturating_sub(from) as f64 / total;
        CpuShare {
            machine: part(self.machine.0, later.machine.0),
            services: part(self.services, later.services),
            bench: part(self.bench, later.bench),
        }
    }
}

/// The report: one Markdown table, a row per coordinator count.
pub fn table(plan: &ScalePlan, rows: &[ScaleRow]) -> String {
    let mut out = String::from(
        "| coordinators | partitions held | load sessions per coordinator | run alone ms | runs | runs/s | p50 ms | p99 ms | max ms | ideal runs/s | of ideal | scaling (÷ 1) | CPU busy: machine / services / bench |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let one = rows
        .iter()
        .find(|r| r.coordinators == 1)
        .and_then(|r| r.outcome.as_ref().ok())
        .map(|m| m.load.rate)
        .filter(|&rate| rate > 0.0);
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let split = |counts: &[usize]| {
        counts
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let percent = |share: f64| format!("{:.0}%", share * 100.0);
    for row in rows {
        let n = row.coordinators;
        match &row.outcome {
            Ok(m) => {
                let ideal = (n * plan.cap()) as f64 / m.alone.as_secs_f64().max(f64::EPSILON);
                let scaling =
                    one.map_or("—".to_owned(), |one| format!("{:.2}", m.load.rate / one));
                let cpu = m.cpu.map_or("—".to_owned(), |c| {
                    format!(
                        "{} / {} / {}",
                        percent(c.machine),
                        percent(c.services),
                        percent(c.bench)
                    )
                });
                out.push_str(&format!(
                    "| {n} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {ideal:.1} | {:.2} | {scaling} | {cpu} |\n",
                    split(&m.partitions),
                    split(&m.sessions),
                    ms(m.alone),
                    m.load.count,
                    m.load.rate,
                    ms(m.load.p50),
                    ms(m.load.p99),
                    ms(m.load.max),
                    m.load.rate / ideal,
                ));
            }
            Err(error) => {
                let dashes = ["—"; 11].join(" | ");
                out.push_str(&format!(
                    "| {n} | {dashes} | error: {} |\n",
                    crate::table::cell(error)
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

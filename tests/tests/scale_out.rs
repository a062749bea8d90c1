//! Scale-out under fault: three coordinators with balanced placement share
//! the partitions of one store on PostgreSQL, and two edges route each call
//! by the session's partition. Real processes: one store, three
//! coordinators (`--placement balanced`, 32 partitions, 2 s leases)
//! executing through a counting gRPC runtime, two edges. Clients on both
//! edges send turns (one in ten `interrupt`, the rest `followup`, up to
//! three in flight per session) and retry each with its idempotency key
//! through whichever edge answers.
//!
//! Seeded faults, in order: SIGKILL the coordinator with the most executing
//! runs; SIGSTOP another for twice the lease TTL, then SIGCONT; partition
//! the third from the store (through a TCP proxy) for twice the TTL; then
//! restart the killed one, and the partitions rebalance onto it. A
//! coordinator that lost its tenure exits by itself; like a pod, it is
//! restarted once it can reach the store.
//!
//! Checks, all zero: duplicate executions (the runtime counts); acknowledged
//! runs missing or not terminal after the drain; interleaved transcripts or
//! lane-order violations per session (interrupts aside); runs executing on
//! the killed coordinator ending other than `lost`. STALE_OWNER refusals
//! must grow in the stop and in the partition phase: the fence acts.
//! Printed: runs, kills, partition takes, retries, takeover p50/max (goal:
//! within TTL + 2 × renew interval).
//!
//! `SCALE_SEED` picks the schedule's choices and the interrupts (printed).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_system_tests::fuzz_seeds::env_or;
use clawgate_system_tests::records::{
    is_terminal, lease_table, live_leases_by_address, run_record,
};
use clawgate_system_tests::rng::SplitMix;
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::sandbox::Backend;
use clawgate_system_tests::system::{CoordinatorSpec, RENEW, Runtime, System, TTL};
use clawgate_system_tests::transcript::{check_lane_order, check_states, run_blocks};
use clawgate_system_tests::turns::{Link, send};
use clawgate_system_tests::wait::{Pacer, poll};
use serde_json::json;
use store_pb::session_store_client::SessionStoreClient;
use tokio::time::Instant;
use tonic::transport::Channel;

const PARTITIONS: u32 = 32;
const COORDINATORS: usize = 3;
const SESSIONS: usize = 12;
/// Turns a session has in flight at most.
const WINDOW: usize = 3;
/// How long a broken system may take to finish (it fails here, not hangs).
const DRAIN: Duration = Duration::from_secs(120);

/// What balanced placement needs beyond the kit's lease-mode flags.
const BALANCED: &[&str] = &[
    "--placement",
    "balanced",
    "--handoff-timeout",
    "3s",
    "--max-executing",
    "8",
];

/// The system under test (one store on PostgreSQL, three balanced
/// lease-mode coordinators behind fault links, two edges), and what the
/// test did to it.
struct Scale {
    system: System,
    runtime: CountingRuntime,
    /// Per coordinator: whether the test keeps it down on purpose (the
    /// killed one, until its restart).
    down: Vec<bool>,
    store_client: SessionStoreClient<Channel>,
    /// Why each restarted coordinator had stopped (its log's reason).
    restarts: Vec<String>,
}

impl Scale {
    async fn start() -> Self {
        let runtime = CountingRuntime::start(Duration::from_millis(400)).await;
        let lease = CoordinatorSpec::lease(Runtime::Grpc(runtime.url()), Duration::from_secs(2))
            .args(BALANCED);
        let system = System::builder()
            .backend(Backend::Postgres)
            .store_args(&["--partitions", &PARTITIONS.to_string()])
            .coordinator(lease)
            .coordinators(COORDINATORS)
            .edges(2)
            .fault_links()
            .start()
            .await;
        let store_client = SessionStoreClient::connect(system.store_url())
            .await
            .unwrap();
        Self {
            system,
            runtime,
            down: vec![false; COORDINATORS],
            store_client,
            restarts: Vec::new(),
        }
    }

    async fn leases(&mut self) -> store_pb::ListLeasesResponse {
        lease_table(&mut self.store_client).await
    }

    /// Live leases by owner address.
    async fn holders(&mut self) -> HashMap<String, usize> {
        live_leases_by_address(&self.leases().await)
    }

    /// Waits until every partition is held, spread over `members` members.
    async fn until_spread(&mut self, members: usize, what: &str) {
        let spread = poll(
            format!("{what}: the partitions to spread over {members}"),
            DRAIN,
            async || {
                self.heal().await;
                let holders = self.holders().await;
                let held: usize = holders.values().sum();
                if held == PARTITIONS as usize && holders.len() == members {
                    Ok(())
                } else {
                    Err(format!("{holders:?}"))
                }
            },
        )
        .await;
        if let Err(timed_out) = spread {
            panic!("{timed_out}:\n{}", self.system.output());
        }
    }

    /// The coordinator executing the most runs now, with its member id and
    /// how many it executes.
    async fn busiest(&mut self) -> (usize, String, usize) {
        let active = self
            .store_client
            .list_active_runs(store_pb::ListActiveRunsRequest { owner: None })
            .await
            .unwrap()
            .into_inner()
            .runs;
        let mut running: HashMap<String, usize> = HashMap::new();
        for run in &active {
            if run.status == store_pb::RunStatus::Running as i32 {
                *running.entry(run.owner.clone()).or_default() += 1;
            }
        }
        let table = self.leases().await;
        let mut best: Option<(usize, String, usize)> = None;
        for lease in &table.leases {
            let Some(owner) = &lease.owner else { continue };
            let Some(n) = self
                .system
                .coordinators
                .iter()
                .position(|c| c.url() == lease.address)
            else {
                continue;
            };
            let count = running.get(owner).copied().unwrap_or(0);
            if best.as_ref().is_none_or(|(_, _, most)| count > *most) {
                best = Some((n, owner.clone(), count));
            }
        }
        best.expect("some member holds partitions")
    }

    /// Restarts a coordinator that stopped by itself (lost its tenure) once
    /// it can reach the store again, as a pod would be.
    async fn heal(&mut self) {
        for n in 0..self.system.coordinators.len() {
            let coordinator = &mut self.system.coordinators[n];
            if !self.down[n]
                && !coordinator.store_link().is_partitioned()
                && coordinator.process.exited()
            {
                let output = coordinator.process.output();
                let why = output
                    .iter()
                    .find(|line| line.contains("ownership lost"))
                    .map_or("started again", String::as_str);
                self.restarts.push(why.chars().take(300).collect());
                self.system.restart_coordinator(n).await;
            }
        }
    }

    /// Waits until coordinator `n` has exited by itself.
    async fn until_exited(&mut self, n: usize, why: &str) {
        let what = format!("the coordinator {why} to stop");
        let coordinator = &mut self.system.coordinators[n];
        let exited = poll(what, DRAIN, async || coordinator.process.exited()).await;
        if let Err(timed_out) = exited {
            panic!("{timed_out}:\n{}", self.system.output());
        }
    }
}

/// How a client saw one of its runs.
#[derive(Debug, Clone)]
struct Sent {
    run_id: String,
    interrupt: bool,
    acknowledged: bool,
    /// Its end as the client saw it (`final`, `error`, `aborted`), if seen.
    ended: Option<String>,
}

#[derive(Default)]
struct Journal {
    runs: Mutex<HashMap<usize, Vec<Sent>>>,
    retries: AtomicUsize,
}

/// Drops `link`'s connection after a failure, counting the retry.
fn failed(link: &mut Link, journal: &Journal) {
    link.failed();
    journal.retries.fetch_add(1, Ordering::Relaxed);
}

/// Sends `run_id` until it is acknowledged (or answered with its end).
async fn send_until_acked(
    link: &mut Link,
    journal: &Journal,
    session: &str,
    run_id: &str,
    mode: &str,
    acked: &mut bool,
) -> Result<String, String> {
    // A loop, not `poll`: this runs in a spawned task.
    let mut pacer = Pacer::new(format!("{run_id} to be acked"), DRAIN);
    loop {
        let result = match link.conn().await {
            Ok(conn) => send(conn, session, run_id, mode, acked).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(answer) => return Ok(answer),
            Err(e) => {
                failed(link, journal);
                pacer.pause(Some(e)).await.map_err(|e| e.to_string())?;
            }
        }
    }
}

/// Waits for `run_id`'s end: from the events the connection saw, else by
/// `agent.wait` (routed by the run), through any edge.
async fn end_of(link: &mut Link, journal: &Journal, run_id: &str) -> Result<String, String> {
    // A loop, not `poll`: this runs in a spawned task.
    let mut pacer = Pacer::new(format!("{run_id} to end"), DRAIN);
    loop {
        let not_yet = match link.conn().await {
            Err(e) => {
                failed(link, journal);
                e
            }
            Ok(conn) => {
                if let Some(end) = conn.ends.get(run_id) {
                    return Ok(format!("{end} (event)"));
                }
                let waited = conn
                    .request("agent.wait", json!({ "runId": run_id, "timeoutMs": 2_000 }))
                    .await;
                match waited {
                    Ok(answer) if answer["ok"] == true => {
                        match answer["payload"]["status"].as_str() {
                            Some("ok") => return Ok("final (agent.wait)".into()),
                            Some("error") => return Ok("error (agent.wait)".into()),
                            _ => format!("not over: {answer}"),
                        }
                    }
                    Ok(answer) => format!("agent.wait refused: {answer}"),
                    Err(e) => {
                        failed(link, journal);
                        e
                    }
                }
            }
        };
        pacer
            .pause(Some(not_yet))
            .await
            .map_err(|e| e.to_string())?;
    }
}

/// A session's client: turns until `stop`, up to `WINDOW` in flight.
async fn session_client(
    session: usize,
    urls: Arc<Mutex<Vec<String>>>,
    journal: Arc<Journal>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Result<(), String> {
    let key = format!("scale-{session}");
    let mut rng = SplitMix(seed ^ (session as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut link = Link::new(urls, session);
    let mut in_flight: VecDeque<usize> = VecDeque::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut turn = 0;
    while !stop.load(Ordering::Relaxed) || !in_flight.is_empty() {
        if stop.load(Ordering::Relaxed) || in_flight.len() >= WINDOW {
            let oldest = in_flight.pop_front().expect("not empty");
            let end = end_of(&mut link, &journal, &sent[oldest].run_id).await?;
            sent[oldest].ended = Some(end);
            continue;
        }
        let run_id = format!("{key}-{turn}");
        turn += 1;
        let interrupt = rng.chance(10);
        let mode = if interrupt { "interrupt" } else { "followup" };
        let mut acked = false;
        let answer = send_until_acked(&mut link, &journal, &key, &run_id, mode, &mut acked).await?;
        let ended = (answer != "accepted").then(|| format!("{answer} (chat.send)"));
        if ended.is_none() {
            in_flight.push_back(sent.len());
        }
        sent.push(Sent {
            run_id,
            interrupt,
            acknowledged: acked,
            ended,
        });
    }
    journal.runs.lock().unwrap().insert(session, sent);
    Ok(())
}

/// How long each of `partitions` took to be held by a live member other
/// than `gone`, from `since`.
async fn takeover_times(
    scale: &mut Scale,
    gone: &str,
    partitions: &[u32],
    since: Instant,
) -> Vec<Duration> {
    let mut times: HashMap<u32, Duration> = HashMap::new();
    // Every 20 ms: each time is measured to within that.
    let what = "the killed member's partitions to move";
    let mut sampling = Pacer::steady(what, DRAIN, Duration::from_millis(20));
    while times.len() < partitions.len() {
        let table = scale.leases().await;
        for lease in &table.leases {
            let moved = lease.owner.as_deref().is_some_and(|o| o != gone)
                && lease.expires_at_ms > table.now_ms;
            if moved && partitions.contains(&lease.partition) {
                times
                    .entry(lease.partition)
                    .or_insert_with(|| since.elapsed());
            }
        }
        if times.len() < partitions.len()
            && let Err(timed_out) = sampling.pause(None).await
        {
            panic!("{timed_out}");
        }
    }
    let mut times: Vec<Duration> = times.into_values().collect();
    times.sort();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_coordinators_share_the_partitions_through_kill_stop_and_partition() {
    let seed: u64 = env_or("SCALE_SEED", 0x5ca1_ab1e);
    clawgate_system_tests::report(&format!("scale-out: seed {seed}"));
    let mut rng = SplitMix(seed);
    let mut scale = Scale::start().await;
    scale.until_spread(COORDINATORS, "at start").await;

    let journal = Arc::new(Journal::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..SESSIONS)
        .map(|s| {
            tokio::spawn(session_client(
                s,
                Arc::new(Mutex::new(scale.system.edge_urls())),
                journal.clone(),
                stop.clone(),
                seed,
            ))
        })
        .collect();
    tokio::time::sleep(rng.millis(2_000, 3_000)).await;

    // 1. SIGKILL the member executing the most runs.
    // The kill must find runs executing, or what it proves of them is
    // vacuous.
    let (killed, killed_member) = {
        let busy = poll("a coordinator executing runs", DRAIN, async || {
            let (n, member, executing) = scale.busiest().await;
            (executing > 0).then_some((n, member))
        })
        .await;
        busy.unwrap_or_else(|timed_out| panic!("{timed_out}:\n{}", scale.system.output()))
    };
    let table = scale.leases().await;
    let its_partitions: Vec<u32> = table
        .leases
        .iter()
        .filter(|l| l.owner.as_deref() == Some(killed_member.as_str()))
        .map(|l| l.partition)
        .collect();
    let killed_at = Instant::now();
    scale.down[killed] = true;
    scale.system.coordinators[killed].process.kill().await;
    let executing_on_killed: Vec<String> = scale
        .store_client
        .list_active_runs(store_pb::ListActiveRunsRequest {
            owner: Some(killed_member.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .runs
        .into_iter()
        .filter(|r| r.status == store_pb::RunStatus::Running as i32)
        .map(|r| r.run_id)
        .collect();
    let takeover = takeover_times(&mut scale, &killed_member, &its_partitions, killed_at).await;
    assert!(
        !executing_on_killed.is_empty(),
        "no run was executing on the killed coordinator: the test would prove nothing of them"
    );
    // The lease's expiry (the TTL after the last renewal) and one placement
    // round, with a renew interval to spare for recovery and a loaded
    // machine: a takeover past it waits for something it should not.
    let bound = TTL + 3 * RENEW;
    let slowest = *takeover.last().expect("the killed member held partitions");
    assert!(
        slowest <= bound,
        "taking over the killed member's partitions took {slowest:?}, more than TTL + 3 × renew ({bound:?})"
    );
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;

    // 2. SIGSTOP another for twice the TTL: its leases lapse and move; on
    // SIGCONT its first acts are refused, and it stops.
    let others: Vec<usize> = (0..COORDINATORS).filter(|s| *s != killed).collect();
    let stopped = others[rng.below(others.len() as u64) as usize];
    let stale_before = scale.system.stale_owner_refusals().await;
    scale.system.coordinators[stopped].process.signal("STOP");
    tokio::time::sleep(2 * TTL).await;
    scale.system.coordinators[stopped].process.signal("CONT");
    scale
        .until_exited(stopped, "stopped for longer than its lease")
        .await;
    let stale_after_stop = scale.system.stale_owner_refusals().await;
    scale.heal().await;
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;

    // 3. Partition the third from the store for twice the TTL: it fences
    // itself, and hears the verdict once the link is back.
    let third = (0..COORDINATORS)
        .find(|s| *s != killed && *s != stopped)
        .expect("three coordinators");
    scale
        .until_spread(COORDINATORS - 1, "before the partition")
        .await;
    scale.system.coordinators[third]
        .store_link()
        .partition(2 * TTL);
    scale
        .until_exited(third, "partitioned from the store")
        .await;
    let stale_after_cut = scale.system.stale_owner_refusals().await;
    scale.heal().await;

    // 4. Restart the killed one: the partitions rebalance onto it.
    scale.down[killed] = false;
    scale.heal().await;
    scale.until_spread(COORDINATORS, "after the restart").await;
    tokio::time::sleep(rng.millis(1_000, 2_000)).await;

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let outcome = match tokio::time::timeout(DRAIN, client).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panicked)) => Err(panicked.to_string()),
            Err(_) => Err("timed out".into()),
        };
        if let Err(e) = outcome {
            panic!("a client failed: {e}\n{}", scale.system.output());
        }
    }

    // Checks.
    let executions = scale.runtime.executions();
    let duplicates: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    let runs = journal.runs.lock().unwrap().clone();
    let mut missing = Vec::new();
    let mut statuses: HashMap<String, usize> = HashMap::new();
    let mut record_status: HashMap<String, (store_pb::RunStatus, String)> = HashMap::new();
    for sent in runs.values() {
        for run in sent {
            let record = run_record(&mut scale.store_client, &run.run_id).await;
            let Some(record) = record else {
                if run.acknowledged {
                    missing.push(run.run_id.clone());
                }
                continue;
            };
            let status = store_pb::RunStatus::try_from(record.status).unwrap();
            use store_pb::RunStatus as S;
            if !is_terminal(status) {
                missing.push(format!("{} ({status:?})", run.run_id));
            }
            if run.ended.as_deref().is_some_and(|e| e.starts_with("final")) && status != S::Ok {
                let logs: Vec<String> = scale
                    .system
                    .output()
                    .lines()
                    .filter(|l| l.contains(&run.run_id) || l.starts_with("===="))
                    .map(str::to_owned)
                    .collect();
                panic!(
                    "{}: the client saw it finish ({:?}), but its record is {record:?}\n{}",
                    run.run_id,
                    run.ended,
                    logs.join("\n")
                );
            }
            let kind = record
                .outcome_json
                .as_deref()
                .and_then(|o| serde_json::from_str::<serde_json::Value>(o).ok())
                .and_then(|o| o["error"]["kind"].as_str().map(str::to_owned));
            let label = match kind {
                Some(kind) if status != S::Lost => format!("{status:?} ({kind})"),
                _ => format!("{status:?}"),
            };
            *statuses.entry(label).or_default() += 1;
            record_status.insert(run.run_id.clone(), (status, record.owner.clone()));
        }
    }
    let mut lane_violations = Vec::new();
    for (session, sent) in &runs {
        let key = format!("scale-{session}");
        let blocks = run_blocks(&mut scale.store_client, &key).await;
        let order: Vec<&str> = sent.iter().map(|r| r.run_id.as_str()).collect();
        let jumpers: HashSet<&str> = sent
            .iter()
            .filter(|r| r.interrupt)
            .map(|r| r.run_id.as_str())
            .collect();
        if let Err(e) = check_lane_order(&blocks, &order, &jumpers) {
            lane_violations.push(format!("{key}: {e}"));
        }
        let ends: HashMap<String, store_pb::RunStatus> = sent
            .iter()
            .filter_map(|r| Some((r.run_id.clone(), record_status.get(&r.run_id)?.0)))
            .collect();
        if let Err(e) = check_states(&blocks, &ends) {
            lane_violations.push(format!("{key}: {e}"));
        }
    }
    // A run executing on the killed coordinator ends `lost`, settled by
    // the next owner; or ends as the killed one decided, when its last
    // write was already on its way to the store at the SIGKILL (the
    // record then still names the killed coordinator as its owner). Any
    // other end is a second owner acting on it.
    let killed_not_lost: Vec<_> = executing_on_killed
        .iter()
        .filter(|id| {
            record_status.get(*id).is_some_and(|(status, owner)| {
                *status != store_pb::RunStatus::Lost && *owner != killed_member
            })
        })
        .map(|id| (id, record_status[id].clone()))
        .collect();
    let table = scale.leases().await;
    let takes: u64 = table.leases.iter().map(|l| l.epoch).sum::<u64>() - u64::from(PARTITIONS);
    let total: usize = runs.values().map(Vec::len).sum();
    let ms = |d: &Duration| d.as_millis();
    clawgate_system_tests::report(&format!(
        "scale-out: runs {total}, kills 1, coordinator restarts {}, partition takes after the first {takes}, \
         retries {}, takeover of {} partitions p50 {} ms max {} ms (goal {} ms), \
         STALE_OWNER refusals: stop phase {}, partition phase {}, record statuses {statuses:?}, \
         executing on the killed pod {}, duplicates {}, missing or not terminal {}, lane violations {}, killed not lost {}",
        scale.restarts.len(),
        journal.retries.load(Ordering::Relaxed),
        takeover.len(),
        ms(&takeover[takeover.len() / 2]),
        ms(takeover.last().unwrap()),
        ms(&(TTL + 2 * RENEW)),
        stale_after_stop - stale_before,
        stale_after_cut - stale_after_stop,
        executing_on_killed.len(),
        duplicates.len(),
        missing.len(),
        lane_violations.len(),
        killed_not_lost.len(),
    ));
    for why in &scale.restarts {
        clawgate_system_tests::report(&format!("scale-out: restarted after: {why}"));
    }
    assert!(
        duplicates.is_empty(),
        "runs executed more than once: {duplicates:?}"
    );
    assert!(
        missing.is_empty(),
        "acknowledged runs missing or not terminal: {missing:?}"
    );
    assert!(lane_violations.is_empty(), "{lane_violations:#?}");
    assert!(
        killed_not_lost.is_empty(),
        "runs executing on the killed coordinator that did not end lost: {killed_not_lost:?}"
    );
    assert!(
        stale_after_stop > stale_before,
        "the stopped coordinator's late acts were not refused"
    );
    assert!(
        stale_after_cut > stale_after_stop,
        "the partitioned coordinator's late acts were not refused"
    );
    assert!(
        total >= SESSIONS * WINDOW,
        "the clients got little done: {total}"
    );
    scale.system.finish().await;
}

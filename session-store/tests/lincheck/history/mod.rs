//! Recording histories of the session store for the linearizability check:
//! clients that choose operations as callers would (`choose`), perform them
//! through gRPC (`perform`), record every call and answer, and the checks
//! run on what they recorded (`verify`, `run`); `faults` kills and pauses
//! the store process under them.

mod choose;
pub mod faults;
mod perform;
pub mod run;
mod verify;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_common::partition::{DEFAULT_PARTITIONS, partition_of};
use clawgate_system_tests::rng::SplitMix as Rng;
use session_store::model::{
    AcquireLeases, AcquireMode, AcquireWriter, AppendEntries, ExpectedSession, FinishRun,
    HeldFence, Lease, LeaseGrant, NewRun, OwnerToken, RenewLeases, RunRecord, RunStatus, Session,
    StartRun,
};
use session_store::{SessionKey, SessionStore, StoreError};

use crate::lincheck::model::{
    self as m, Input, LeaseView, Member, Output, Partition, Refusal, Run, RunView, SessionView,
    Sid, Token,
};
use crate::lincheck::{self, Operation, Stats};
use crate::suite::{self, harness::Harness};

use choose::*;
pub use perform::perform;
use perform::*;
use verify::*;

pub const DEFAULT_OPS: usize = 2000;
pub const DEFAULT_SEED: u64 = 0x0014_f3ce;
pub const DEFAULT_TASKS: usize = 8;
/// gRPC connections the clients share, as several coordinators would.
pub const CONNECTIONS: usize = 4;
/// Partitions, and sessions in each (all sessions of a partition share its
/// lease, so each partition is checked as one history).
pub const PARTITIONS: usize = 2;
pub const SESSIONS_PER_PARTITION: usize = 2;
pub const MEMBERS: u8 = 3;
/// Leases short enough to expire between a member's calls, so that takes
/// decided by expiry are in every history (`LINCHECK_LEASE_TTL_MS`).
pub const DEFAULT_LEASE_TTL_MS: u64 = 25;
/// Store kills and pauses in a faulty run (`LINCHECK_KILLS`,
/// `LINCHECK_PAUSES`), spread evenly over it.
pub const DEFAULT_KILLS: usize = 3;
pub const DEFAULT_PAUSES: usize = 2;
/// The clients' deadline for one call in a faulty run: a call that has not
/// answered by then is abandoned and indeterminate.
pub const CALL_DEADLINE: Duration = Duration::from_millis(1500);
pub const TERMINAL: [RunStatus; 6] = [
    RunStatus::Ok,
    RunStatus::Error,
    RunStatus::Aborted,
    RunStatus::Timeout,
    RunStatus::Superseded,
    RunStatus::Lost,
];
/// Every kind of operation, as `Input::kind` names them.
pub const KINDS: [&str; 14] = [
    "acquire",
    "takeover",
    "append",
    "release",
    "reset",
    "delete",
    "get_session",
    "create_run",
    "start_run",
    "finish_run",
    "take_lease",
    "renew_lease",
    "release_lease",
    "list_leases",
];
/// Refusals each run must have met, or it proves little.
pub const REFUSALS_EXPECTED: [&str; 6] = [
    "STALE_WRITER",
    "SESSION_REPLACED",
    "WRITER_CONFLICT",
    "STALE_OWNER",
    "RUN_VERSION_CONFLICT",
    "RUN_TERMINAL",
];

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub ops: usize,
    pub seed: u64,
    pub tasks: usize,
    pub lease_ttl_ms: u64,
    pub kills: usize,
    pub pauses: usize,
}

pub fn env_number(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    let raw = raw.trim().replace('_', "");
    let parsed = match raw.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => raw.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={raw:?} is not a number")))
}

pub fn config() -> Config {
    Config {
        ops: env_number("LINCHECK_OPS").map_or(DEFAULT_OPS, |n| n as usize),
        seed: env_number("LINCHECK_SEED").unwrap_or(DEFAULT_SEED),
        tasks: env_number("LINCHECK_TASKS").map_or(DEFAULT_TASKS, |n| (n as usize).max(1)),
        lease_ttl_ms: env_number("LINCHECK_LEASE_TTL_MS").unwrap_or(DEFAULT_LEASE_TTL_MS),
        kills: env_number("LINCHECK_KILLS").map_or(DEFAULT_KILLS, |n| n as usize),
        pauses: env_number("LINCHECK_PAUSES").map_or(DEFAULT_PAUSES, |n| n as usize),
    }
}

/// The session keys: `PARTITIONS` partitions with `SESSIONS_PER_PARTITION`
/// keys each. Session `g` is `s = g % SESSIONS_PER_PARTITION` of partition
/// `g / SESSIONS_PER_PARTITION`.
pub struct Layout {
    pub keys: Vec<SessionKey>,
    pub partitions: Vec<u32>,
}

impl Layout {
    pub fn new() -> Self {
        let mut found: Vec<(u32, Vec<SessionKey>)> = Vec::new();
        for i in 0.. {
            let key = suite::key(&format!("lin-{i}"));
            let partition = partition_of(key.as_str(), DEFAULT_PARTITIONS);
            match found.iter_mut().find(|(p, _)| *p == partition) {
                Some((_, keys)) => keys.push(key),
                None => found.push((partition, vec![key])),
            }
            let full = found
                .iter()
                .filter(|(_, keys)| keys.len() >= SESSIONS_PER_PARTITION)
                .count();
            if full == PARTITIONS {
                break;
            }
        }
        let mut layout = Self {
            keys: Vec::new(),
            partitions: Vec::new(),
        };
        for (partition, keys) in found
            .into_iter()
            .filter(|(_, keys)| keys.len() >= SESSIONS_PER_PARTITION)
        {
            layout.partitions.push(partition);
            layout
                .keys
                .extend(keys.into_iter().take(SESSIONS_PER_PARTITION));
        }
        layout
    }

    pub fn sessions(&self) -> usize {
        self.keys.len()
    }
}

pub fn part_of(g: usize) -> usize {
    g / SESSIONS_PER_PARTITION
}

pub fn local(g: usize) -> u8 {
    (g % SESSIONS_PER_PARTITION) as u8
}

pub fn global(part: usize, s: u8) -> usize {
    part * SESSIONS_PER_PARTITION + s as usize
}

// ---- the run ----------------------------------------------------------------

/// The connections to the store as it is now: `generation` counts its
/// restarts.
#[derive(Clone)]
pub struct Connections {
    pub generation: u64,
    pub remotes: Vec<Arc<dyn SessionStore>>,
}

pub struct Shared {
    pub layout: Layout,
    pub board: Mutex<Board>,
    /// The global logical clock: every call and every answer takes a tick.
    pub clock: AtomicU64,
    pub seed: u64,
    pub lease_ttl_ms: u64,
    /// `None` while the store is down (between a kill and its restart):
    /// clients wait before their next call.
    pub store: tokio::sync::watch::Sender<Option<Connections>>,
    /// Whether faults are injected: a call that fails without a rule's
    /// answer, or outlives `CALL_DEADLINE`, is then indeterminate; without
    /// faults it fails the test.
    pub faulty: bool,
    /// Operations answered or abandoned so far, and calls abandoned at
    /// their deadline (the fault injector paces itself by them).
    pub done: AtomicU64,
    pub timeouts: AtomicU64,
    /// Per generation of the store that was killed, the logical time by
    /// which it had surely stopped acting: its successor was serving. An
    /// operation sent to it took effect before then, or never (on
    /// PostgreSQL a COMMIT already sent when the store died is the
    /// database's to finish, in far less time than a restart takes).
    pub ended: Mutex<HashMap<u64, u64>>,
}

/// One recorded operation: its partition, its id (which tags its entries
/// and names the placeholder of a sessionId it may have made).
pub struct Recorded {
    pub part: usize,
    pub id: u64,
    /// The generation of the store the call went to.
    pub generation: u64,
    pub op: Operation<Input, Output>,
}

/// How long a client waits for the store to come back after a call failed
/// (a bound on a broken test, not a measurement).
const OUTAGE_LIMIT: Duration = Duration::from_secs(60);

/// The wall clock in Unix ms, the scale of the store's `now_ms`.
pub fn wall_ms() -> u64 {
    clawgate_common::clock::now_ms() as u64
}

/// The store's connections once it is up.
async fn connections(shared: &Shared) -> Connections {
    let mut watch = shared.store.subscribe();
    let up = tokio::time::timeout(OUTAGE_LIMIT, watch.wait_for(Option::is_some)).await;
    let up = up.unwrap_or_else(|_| panic!("the store was down for over {OUTAGE_LIMIT:?}"));
    up.expect("the fault injector is there")
        .clone()
        .expect("up")
}

/// Whether the store of `generation` has been killed.
fn killed(shared: &Shared, generation: u64) -> bool {
    shared
        .store
        .borrow()
        .as_ref()
        .is_none_or(|now| now.generation != generation)
}

/// After a failed connection: the store is being killed. Waits until it
/// runs again as a newer generation.
async fn await_restart(shared: &Shared, failed: u64) {
    let mut watch = shared.store.subscribe();
    let newer = |c: &Option<Connections>| c.as_ref().is_some_and(|c| c.generation > failed);
    let restarted = tokio::time::timeout(OUTAGE_LIMIT, watch.wait_for(newer)).await;
    restarted.unwrap_or_else(|_| {
        panic!("a call failed without a rule's answer and the store was not restarted within {OUTAGE_LIMIT:?}")
    }).expect("the fault injector is there");
}

pub async fn client(shared: Arc<Shared>, task: usize, count: usize) -> Vec<Recorded> {
    let seed = shared.seed;
    let mut rng = Rng(seed ^ (task as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
    let sessions = shared.layout.sessions();
    let mut me = Local {
        member: (task % MEMBERS as usize) as Member,
        held: vec![None; sessions],
        runs: Vec::new(),
        next_run: task as Run * 1_000_000,
        probe: None,
    };
    let mut recorded = Vec::with_capacity(count);
    for i in 0..count {
        let connections = connections(&shared).await;
        let store = &*connections.remotes[task % connections.remotes.len()];
        let (part, input) = {
            let board = shared.board.lock().unwrap();
            choose(&mut rng, &mut me, &board, sessions)
        };
        let id = task as u64 * 1_000_000 + i as u64;
        let call = shared.clock.fetch_add(1, Ordering::SeqCst);
        let called_ms = wall_ms();
        let performed = perform(store, &shared.layout, part, &input, id, shared.lease_ttl_ms);
        let answer = match shared.faulty {
            true => tokio::time::timeout(CALL_DEADLINE, performed).await,
            false => Ok(performed.await),
        };
        let ret = shared.clock.fetch_add(1, Ordering::SeqCst);
        // Ceiling: the store's clock may round up.
        let returned_ms = wall_ms() + 1;
        let (output, ret) = match answer {
            Ok(Ok(output)) => (output, ret),
            // The fault injector marks the store down before it kills it,
            // so an error from a killed store finds it marked.
            Ok(Err(_)) if shared.faulty && killed(&shared, connections.generation) => {
                await_restart(&shared, connections.generation).await;
                (Output::Unknown { op: id, called_ms }, lincheck::NEVER)
            }
            Err(_deadline) => {
                shared.timeouts.fetch_add(1, Ordering::SeqCst);
                (Output::Unknown { op: id, called_ms }, lincheck::NEVER)
            }
            Ok(Err(other)) => panic!(
                "seed {seed}: {input:?} failed without a rule's answer ({other:?}) \
                 where no fault was injected"
            ),
        };
        if let Output::Lease { now, .. } = output {
            assert!(
                (called_ms..=returned_ms).contains(&now),
                "seed {seed}: the store decided {input:?} at {now}, outside the call \
                 [{called_ms}, {returned_ms}] by this machine's clock"
            );
        }
        learn(
            &mut me,
            &mut shared.board.lock().unwrap(),
            part,
            &input,
            &output,
        );
        shared.done.fetch_add(1, Ordering::SeqCst);
        recorded.push(Recorded {
            part,
            id,
            generation: connections.generation,
            op: Operation {
                client: task,
                input,
                call,
                output,
                ret,
            },
        });
    }
    recorded
}

//! Issue 14: the writer fence is linearizable. Several clients issue random
//! acquires, takeovers, appends, releases, resets, deletes, reads, run
//! starts and finishes and lease takes, renewals and releases at once,
//! through the gRPC server and `RemoteStore`, on each backend; every call
//! and answer is recorded with a global logical clock, and the history is
//! checked against the sequential model (`lincheck/model.rs`) with a
//! Wing–Gong checker (`lincheck/mod.rs`). Afterwards every transcript must
//! hold exactly the entries of the appends that were acknowledged. Last, one
//! interleaving on PostgreSQL (a lease release while a write of its tenure
//! is in flight) is forced and checked the same way.
//!
//! `LINCHECK_OPS` (operations per backend, default 2000), `LINCHECK_SEED`
//! (decimal or 0x-hex), `LINCHECK_TASKS` (clients, default 8). The seed
//! fixes every client's choices; the interleaving is the scheduler's.

mod lincheck;
mod suite;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_common::partition::{DEFAULT_PARTITIONS, partition_of};
use lincheck::model::{
    self as m, Input, LeaseView, Member, Output, Partition, Refusal, Run, RunView, SessionView,
    Sid, Token,
};
use lincheck::{Operation, Stats};
use session_store::model::{
    AcquireLeases, AcquireMode, AcquireWriter, AppendEntries, ExpectedSession, FinishRun,
    HeldFence, Lease, LeaseGrant, NewRun, OwnerToken, RenewLeases, RunRecord, RunStatus, Session,
    StartRun,
};
use session_store::{SessionKey, SessionStore, StoreError};
use suite::harness::{self, Harness, TestServer};

const DEFAULT_OPS: usize = 2000;
const DEFAULT_SEED: u64 = 0x0014_f3ce;
const DEFAULT_TASKS: usize = 8;
/// gRPC connections the clients share, as several coordinators would.
const CONNECTIONS: usize = 4;
/// Partitions, and sessions in each (all sessions of a partition share its
/// lease, so each partition is checked as one history).
const PARTITIONS: usize = 2;
const SESSIONS_PER_PARTITION: usize = 2;
const MEMBERS: u8 = 3;
/// Leases last an hour: the model leaves expiry out.
const LEASE_TTL_MS: u64 = 3_600_000;
const TERMINAL: [RunStatus; 6] = [
    RunStatus::Ok,
    RunStatus::Error,
    RunStatus::Aborted,
    RunStatus::Timeout,
    RunStatus::Superseded,
    RunStatus::Lost,
];
/// Every kind of operation, as `Input::kind` names them.
const KINDS: [&str; 14] = [
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
const REFUSALS_EXPECTED: [&str; 6] = [
    "STALE_WRITER",
    "SESSION_REPLACED",
    "WRITER_CONFLICT",
    "STALE_OWNER",
    "RUN_VERSION_CONFLICT",
    "RUN_TERMINAL",
];

#[derive(Debug, Clone, Copy)]
struct Config {
    ops: usize,
    seed: u64,
    tasks: usize,
}

fn env_number(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    let raw = raw.trim().replace('_', "");
    let parsed = match raw.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => raw.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={raw:?} is not a number")))
}

fn config() -> Config {
    Config {
        ops: env_number("LINCHECK_OPS").map_or(DEFAULT_OPS, |n| n as usize),
        seed: env_number("LINCHECK_SEED").unwrap_or(DEFAULT_SEED),
        tasks: env_number("LINCHECK_TASKS").map_or(DEFAULT_TASKS, |n| (n as usize).max(1)),
    }
}

/// SplitMix64 from the test kit: small, seeded, good enough to pick operations.
use clawgate_system_tests::rng::SplitMix as Rng;
use clawgate_system_tests::wait::wait_for;

/// The session keys: `PARTITIONS` partitions with `SESSIONS_PER_PARTITION`
/// keys each. Session `g` is `s = g % SESSIONS_PER_PARTITION` of partition
/// `g / SESSIONS_PER_PARTITION`.
struct Layout {
    keys: Vec<SessionKey>,
    partitions: Vec<u32>,
}

impl Layout {
    fn new() -> Self {
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

    fn sessions(&self) -> usize {
        self.keys.len()
    }
}

fn part_of(g: usize) -> usize {
    g / SESSIONS_PER_PARTITION
}

fn local(g: usize) -> u8 {
    (g % SESSIONS_PER_PARTITION) as u8
}

fn global(part: usize, s: u8) -> usize {
    part * SESSIONS_PER_PARTITION + s as usize
}

// ---- what the clients know ----------------------------------------------------

/// A fence somebody was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    sid: Sid,
    run: Run,
    fence: u64,
}

/// What every client has seen, shared: clients use it to send what real
/// callers would (the current token, the current writer), but also stale
/// values, which the store must refuse.
struct Board {
    /// Per partition, every token seen, by epoch.
    tokens: Vec<Vec<Token>>,
    /// Per session, every sessionId seen, newest last.
    ids: Vec<Vec<Sid>>,
    /// Per session, recent fences issued.
    grants: Vec<Vec<Grant>>,
    /// Per session, the writer last seen.
    writer: Vec<Option<Run>>,
    /// Recent runs: (run, session, version last seen).
    runs: Vec<(Run, usize, u64)>,
}

impl Board {
    fn new(sessions: usize) -> Self {
        Self {
            tokens: vec![Vec::new(); PARTITIONS],
            ids: vec![Vec::new(); sessions],
            grants: vec![Vec::new(); sessions],
            writer: vec![None; sessions],
            runs: Vec::new(),
        }
    }

    fn see_token(&mut self, part: usize, lease: LeaseView) {
        let Some(member) = lease.owner else { return };
        let token = Token {
            member,
            epoch: lease.epoch,
        };
        let tokens = &mut self.tokens[part];
        if !tokens.contains(&token) {
            tokens.push(token);
            tokens.sort_by_key(|t| t.epoch);
        }
    }

    fn see_session(&mut self, g: usize, view: &SessionView) {
        if !self.ids[g].contains(&view.id) {
            self.ids[g].push(view.id);
        }
        self.writer[g] = view.writer;
    }

    fn see_grant(&mut self, g: usize, grant: Grant) {
        let grants = &mut self.grants[g];
        grants.push(grant);
        if grants.len() > 16 {
            grants.remove(0);
        }
    }

    fn see_run(&mut self, run: Run, g: usize, version: u64) {
        match self.runs.iter_mut().find(|r| r.0 == run) {
            Some(known) => known.2 = version,
            None => {
                self.runs.push((run, g, version));
                if self.runs.len() > 32 {
                    self.runs.remove(0);
                }
            }
        }
    }
}

/// A run a client created.
#[derive(Debug, Clone, Copy)]
struct MyRun {
    run: Run,
    g: usize,
    version: u64,
    writer: Option<(Sid, u64)>,
    started: bool,
    finished: bool,
}

/// One client's own knowledge.
struct Local {
    member: Member,
    /// Per session, the fence this client holds (as far as it knows).
    held: Vec<Option<Grant>>,
    runs: Vec<MyRun>,
    next_run: Run,
    /// A read to make next: after a lease changed hands, whether the writes
    /// of the tenure before are all in (or all out) is what a read shows.
    probe: Option<usize>,
}

impl Local {
    fn new_run(&mut self) -> Run {
        self.next_run += 1;
        self.next_run
    }

    fn run_mut(&mut self, run: Run) -> Option<&mut MyRun> {
        self.runs.iter_mut().find(|r| r.run == run)
    }
}

// ---- choosing an operation ------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Kind {
    Append,
    Acquire,
    Takeover,
    Release,
    Reset,
    Delete,
    Read,
    CreateRun,
    StartRun,
    FinishRun,
    TakeLease,
    RenewLease,
    ReleaseLease,
    ReadLease,
}

/// The mix, in relative weights.
const MIX: [(Kind, u64); 14] = [
    (Kind::Append, 26),
    (Kind::Acquire, 9),
    (Kind::Takeover, 6),
    (Kind::Release, 5),
    (Kind::Reset, 3),
    (Kind::Delete, 1),
    (Kind::Read, 7),
    (Kind::CreateRun, 6),
    (Kind::StartRun, 7),
    (Kind::FinishRun, 7),
    (Kind::TakeLease, 4),
    (Kind::RenewLease, 3),
    (Kind::ReleaseLease, 2),
    (Kind::ReadLease, 2),
];

/// The token a write carries: mostly the newest one known (the current
/// owner's, as a caller that follows the leases would have), sometimes the
/// client's own member's, an old one, or none.
fn token_for(rng: &mut Rng, board: &Board, part: usize, member: Member) -> Option<Token> {
    let known = &board.tokens[part];
    match rng.below(100) {
        0..88 => known.last().copied(),
        88..93 => known
            .iter()
            .rev()
            .find(|t| t.member == member)
            .or(known.last())
            .copied(),
        93..97 => rng.pick(known),
        _ => None,
    }
}

/// A version near the one known: mostly right, sometimes one off.
fn version_near(rng: &mut Rng, known: u64) -> u64 {
    match rng.below(100) {
        0..80 => known,
        80..90 => known + 1,
        _ => known.saturating_sub(1).max(1),
    }
}

fn choose(rng: &mut Rng, me: &mut Local, board: &Board, sessions: usize) -> (usize, Input) {
    if let Some(part) = me.probe.take() {
        let s = rng.below(SESSIONS_PER_PARTITION as u64) as u8;
        return (part, Input::Read { s });
    }
    let total: u64 = MIX.iter().map(|(_, w)| w).sum();
    let mut roll = rng.below(total);
    let mut kind = Kind::Read;
    for (k, weight) in MIX {
        if roll < weight {
            kind = k;
            break;
        }
        roll -= weight;
    }
    let any_session = |rng: &mut Rng| rng.below(sessions as u64) as usize;
    let new_acquire = |rng: &mut Rng, me: &mut Local, takeover: bool| {
        let g = any_session(rng);
        let run = match me.held[g] {
            Some(held) if rng.chance(40) => held.run,
            _ => me.new_run(),
        };
        let ids = &board.ids[g];
        let expect = match rng.below(100) {
            0..70 => None,
            70..95 => ids.last().copied(),
            _ => rng.pick(ids),
        };
        let expected_writer = match rng.below(100) {
            0..50 => board.writer[g],
            50..90 => None,
            _ => me.held[g].map(|h| h.run),
        };
        let token = token_for(rng, board, part_of(g), me.member);
        let input = Input::Acquire {
            s: local(g),
            expect,
            expected_writer,
            run,
            takeover,
            token,
        };
        (part_of(g), input)
    };
    match kind {
        Kind::Append => {
            let mine: Vec<usize> = (0..sessions).filter(|g| me.held[*g].is_some()).collect();
            let g = match rng.pick(&mine) {
                Some(g) if rng.chance(70) => g,
                _ => any_session(rng),
            };
            let grant = match rng.below(100) {
                0..80 => me.held[g].or_else(|| board.grants[g].last().copied()),
                80..95 => rng.pick(&board.grants[g]),
                _ => me.held[g].map(|h| Grant {
                    fence: h.fence + 1,
                    ..h
                }),
            };
            let Some(grant) = grant else {
                return new_acquire(rng, me, false);
            };
            let token = token_for(rng, board, part_of(g), me.member);
            let input = Input::Append {
                s: local(g),
                sid: grant.sid,
                run: grant.run,
                fence: grant.fence,
                count: 1 + rng.below(3),
                token,
            };
            (part_of(g), input)
        }
        Kind::Acquire => new_acquire(rng, me, false),
        Kind::Takeover => new_acquire(rng, me, true),
        Kind::Release => {
            let g = any_session(rng);
            let grant = match me.held[g] {
                Some(held) if rng.chance(70) => Some(held),
                _ => rng.pick(&board.grants[g]),
            };
            let Some(grant) = grant else {
                return new_acquire(rng, me, false);
            };
            let token = token_for(rng, board, part_of(g), me.member);
            let input = Input::Release {
                s: local(g),
                run: grant.run,
                fence: grant.fence,
                token,
            };
            (part_of(g), input)
        }
        Kind::Reset => {
            let g = any_session(rng);
            (part_of(g), Input::Reset { s: local(g) })
        }
        Kind::Delete => {
            let g = any_session(rng);
            (part_of(g), Input::Delete { s: local(g) })
        }
        Kind::Read => {
            let g = any_session(rng);
            (part_of(g), Input::Read { s: local(g) })
        }
        Kind::CreateRun => {
            // Now and then the same run again (an idempotent retry).
            let (run, g) = match rng.pick(&me.runs) {
                Some(old) if rng.chance(10) => (old.run, old.g),
                _ => {
                    let run = me.new_run();
                    let g = any_session(rng);
                    me.runs.push(MyRun {
                        run,
                        g,
                        version: 1,
                        writer: None,
                        started: false,
                        finished: false,
                    });
                    if me.runs.len() > 8 {
                        me.runs.remove(0);
                    }
                    (run, g)
                }
            };
            let token = token_for(rng, board, part_of(g), me.member);
            let input = Input::CreateRun {
                s: local(g),
                run,
                owner: me.member,
                token,
                uses: 0,
            };
            (part_of(g), input)
        }
        Kind::StartRun => {
            let fresh: Vec<MyRun> = me.runs.iter().filter(|r| !r.started).copied().collect();
            let picked = match rng.below(100) {
                0..80 => rng.pick(&fresh).map(|r| (r.run, r.g, r.version)),
                80..90 => rng.pick(&board.runs),
                _ => rng.pick(&me.runs).map(|r| (r.run, r.g, r.version)),
            };
            let Some((run, g, version)) = picked.or_else(|| rng.pick(&board.runs)) else {
                return new_acquire(rng, me, true);
            };
            let takeover = rng.chance(50);
            let expected_writer = match rng.chance(50) {
                true => board.writer[g],
                false => None,
            };
            let token = token_for(rng, board, part_of(g), me.member);
            let input = Input::StartRun {
                s: local(g),
                run,
                version: version_near(rng, version),
                owner: me.member,
                takeover,
                expected_writer,
                count: rng.below(3),
                history: rng.below(4) as u32,
                token,
                uses: 0,
            };
            (part_of(g), input)
        }
        Kind::FinishRun => {
            let started: Vec<MyRun> = me
                .runs
                .iter()
                .filter(|r| r.started && !r.finished)
                .copied()
                .collect();
            let finished: Vec<MyRun> = me.runs.iter().filter(|r| r.finished).copied().collect();
            let picked = match rng.below(100) {
                0..75 => rng.pick(&started),
                // A retry after the end.
                75..90 => rng.pick(&finished),
                _ => rng.pick(&me.runs),
            };
            let Some(run) = picked.or_else(|| rng.pick(&me.runs)) else {
                return new_acquire(rng, me, false);
            };
            let writer = match rng.chance(90) {
                true => run.writer,
                false => None,
            };
            let count = match writer {
                Some(_) => rng.below(3),
                None => 0,
            };
            let token = token_for(rng, board, part_of(run.g), me.member);
            let input = Input::FinishRun {
                s: local(run.g),
                run: run.run,
                version: version_near(rng, run.version),
                status: rng.pick(&TERMINAL).expect("statuses"),
                writer,
                count,
                token,
                uses: 0,
            };
            (part_of(run.g), input)
        }
        Kind::TakeLease => {
            let part = rng.below(PARTITIONS as u64) as usize;
            let input = Input::TakeLease {
                member: me.member,
                steal: rng.chance(40),
            };
            (part, input)
        }
        Kind::RenewLease | Kind::ReleaseLease => {
            let part = rng.below(PARTITIONS as u64) as usize;
            let known = &board.tokens[part];
            let own = known.iter().rev().find(|t| t.member == me.member).copied();
            let token = match rng.below(100) {
                0..60 => own,
                60..90 => known.last().copied(),
                _ => rng.pick(known),
            };
            let Some(token) = token.or(own) else {
                let steal = rng.chance(40);
                return (
                    part,
                    Input::TakeLease {
                        member: me.member,
                        steal,
                    },
                );
            };
            let token = Token {
                member: me.member,
                ..token
            };
            let input = match kind {
                Kind::RenewLease => Input::RenewLease { token },
                _ => Input::ReleaseLease { token },
            };
            (part, input)
        }
        Kind::ReadLease => (rng.below(PARTITIONS as u64) as usize, Input::ReadLease),
    }
}

// ---- performing it through gRPC -------------------------------------------------

fn run_name(run: Run) -> String {
    format!("r{run}")
}

fn parse_run(raw: &str) -> Run {
    raw.strip_prefix('r')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("run id {raw:?} is none the test made"))
}

fn member_name(member: Member) -> String {
    format!("m{member}")
}

fn parse_member(raw: &str) -> Member {
    raw.strip_prefix('m')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("member {raw:?} is none the test made"))
}

fn sid_of(id: uuid::Uuid) -> Sid {
    Sid(id.as_u128())
}

fn session_view(s: &Session) -> SessionView {
    SessionView {
        id: sid_of(s.session_id),
        writer: s.active_writer_run_id.as_deref().map(parse_run),
        fence: s.fence_token,
        entries: s.entry_count,
        last_run: s.last_run_id.as_deref().map(parse_run),
        last_status: s.last_run_status,
    }
}

fn run_view(r: &RunRecord) -> RunView {
    RunView {
        status: r.status,
        version: r.version,
        owner: parse_member(&r.owner),
        sid: r.session_id.map(sid_of),
        fence: r.fence_token,
    }
}

fn lease_view(l: &Lease) -> LeaseView {
    LeaseView {
        owner: l.owner.as_deref().map(parse_member),
        epoch: l.epoch,
    }
}

/// A refusal as the model states it. Anything but a rule's refusal means
/// the operation's effect is unknown: the history would have an operation
/// without an answer, which these tests do not model, so they fail.
fn refusal(err: StoreError, seed: u64) -> Refusal {
    let view = |s: Option<Box<Session>>| s.as_deref().map(session_view);
    match err {
        StoreError::StaleWriter { current, .. } => Refusal::StaleWriter(view(current)),
        StoreError::SessionReplaced { current, .. } => Refusal::SessionReplaced(view(current)),
        StoreError::WriterConflict { current, .. } => Refusal::WriterConflict(view(current)),
        StoreError::StaleOwner { current, .. } => {
            Refusal::StaleOwner(current.as_deref().map(lease_view))
        }
        StoreError::RunNotFound(_) => Refusal::RunNotFound,
        StoreError::RunVersionConflict { current, .. } => {
            Refusal::RunVersionConflict(run_view(&current))
        }
        StoreError::RunTerminal { current } => Refusal::RunTerminal(run_view(&current)),
        StoreError::InvalidArgument(_) => Refusal::Invalid,
        other => panic!(
            "seed {seed}: an operation failed without a rule's answer ({other:?}); \
             its effect is unknown, which this test does not model"
        ),
    }
}

fn tagged_entries(role: &str, op: u64, count: u64) -> Vec<session_store::model::NewEntry> {
    (0..count)
        .map(|i| suite::text_entry(role, &tag(op, i)))
        .collect()
}

fn tag(op: u64, i: u64) -> String {
    format!("o{op}.{i}")
}

fn lease_answer(grant: LeaseGrant, partition: u32) -> Output {
    let granted = grant.granted.iter().find(|l| l.partition == partition);
    let refused = grant.refused.iter().find(|l| l.partition == partition);
    match (granted, refused) {
        (Some(lease), None) => Output::Lease {
            granted: true,
            lease: lease_view(lease),
        },
        (None, Some(lease)) => Output::Lease {
            granted: false,
            lease: lease_view(lease),
        },
        _ => panic!("the partition is neither granted nor refused: {grant:?}"),
    }
}

async fn perform(
    store: &dyn SessionStore,
    layout: &Layout,
    part: usize,
    input: &Input,
    op: u64,
    seed: u64,
) -> Output {
    let partition = layout.partitions[part];
    let key = |s: u8| &layout.keys[global(part, s)];
    let owner_token = |t: Option<Token>| {
        t.map(|t| OwnerToken {
            partition,
            member: member_name(t.member),
            epoch: t.epoch,
        })
    };
    let or_refused = |result: Result<Output, StoreError>| match result {
        Ok(out) => out,
        Err(err) => Output::Refused(refusal(err, seed)),
    };
    let acquired = |a: session_store::model::Acquired| m::Acquired {
        fence: a.fence_token,
        session: session_view(&a.session),
        superseded: a.superseded_run_id.as_deref().map(parse_run),
        created: a.session_created,
    };
    match *input {
        Input::Acquire {
            s,
            expect,
            expected_writer,
            run,
            takeover,
            token,
        } => {
            let req = AcquireWriter {
                key: key(s).clone(),
                expected_session: match expect {
                    None => ExpectedSession::Current,
                    Some(sid) => ExpectedSession::Id(uuid::Uuid::from_u128(sid.0)),
                },
                expected_writer: expected_writer.map(run_name),
                run_id: run_name(run),
                mode: match takeover {
                    true => AcquireMode::Takeover,
                    false => AcquireMode::Cas,
                },
                label: None,
                owner_token: owner_token(token),
            };
            or_refused(
                store
                    .acquire_writer(req)
                    .await
                    .map(|a| Output::Acquired(acquired(a))),
            )
        }
        Input::Release {
            s,
            run,
            fence,
            token,
        } => {
            let token = owner_token(token);
            let result = store
                .release_writer(key(s), &run_name(run), fence, token.as_ref())
                .await;
            or_refused(result.map(|r| Output::Released {
                released: r.released,
                session: r.session.as_ref().map(session_view),
            }))
        }
        Input::Append {
            s,
            sid,
            run,
            fence,
            count,
            token,
        } => {
            let req = AppendEntries {
                key: key(s).clone(),
                session_id: uuid::Uuid::from_u128(sid.0),
                run_id: run_name(run),
                fence_token: fence,
                entries: tagged_entries("assistant", op, count),
                owner_token: owner_token(token),
            };
            or_refused(store.append(req).await.map(|a| Output::Appended {
                first: a.first_seq,
                last: a.last_seq,
                session: session_view(&a.session),
            }))
        }
        Input::Reset { s } => {
            or_refused(store.reset_session(key(s)).await.map(|r| Output::Reset {
                session: session_view(&r.session),
                previous: r.previous_session_id.map(sid_of),
                superseded: r.superseded_run_id.as_deref().map(parse_run),
            }))
        }
        Input::Delete { s } => {
            or_refused(
                store
                    .delete_session(key(s), false)
                    .await
                    .map(|d| Output::Deleted {
                        deleted: d.deleted,
                        previous: d.previous_session_id.map(sid_of),
                        superseded: d.superseded_run_id.as_deref().map(parse_run),
                    }),
            )
        }
        Input::Read { s } => or_refused(
            store
                .get_session(key(s))
                .await
                .map(|s| Output::Read(s.as_ref().map(session_view))),
        ),
        Input::CreateRun {
            s,
            run,
            owner,
            token,
            ..
        } => {
            let new = NewRun {
                run_id: run_name(run),
                session_key: key(s).clone(),
                kind: "agent".into(),
                fingerprint: "fp".into(),
                status: RunStatus::Accepted,
                owner: member_name(owner),
                request_json: r#"{"message":"hi"}"#.into(),
                owner_token: owner_token(token),
                expected_settings: None,
            };
            or_refused(store.create_run(new).await.map(|c| Output::RunCreated {
                created: c.created,
                record: run_view(&c.record),
            }))
        }
        Input::StartRun {
            s,
            run,
            version,
            owner,
            takeover,
            expected_writer,
            count,
            history,
            token,
            ..
        } => {
            let req = StartRun {
                run_id: run_name(run),
                key: key(s).clone(),
                expected_version: version,
                owner: member_name(owner),
                mode: match takeover {
                    true => AcquireMode::Takeover,
                    false => AcquireMode::Cas,
                },
                expected_writer: expected_writer.map(run_name),
                label: None,
                entries: tagged_entries("user", op, count),
                history_limit: history,
                owner_token: owner_token(token),
            };
            or_refused(store.start_run(req).await.map(|st| Output::Started {
                record: run_view(&st.record),
                acquired: acquired(st.acquired),
                first_seq: st.first_seq,
                history: st.history.iter().map(|e| e.seq).collect(),
            }))
        }
        Input::FinishRun {
            s,
            run,
            version,
            status,
            writer,
            count,
            token,
            ..
        } => {
            let req = FinishRun {
                run_id: run_name(run),
                key: key(s).clone(),
                expected_version: version,
                status,
                outcome_json: None,
                writer: writer.map(|(sid, fence)| HeldFence {
                    session_id: uuid::Uuid::from_u128(sid.0),
                    fence_token: fence,
                }),
                entries: tagged_entries("assistant", op, count),
                owner_token: owner_token(token),
            };
            or_refused(store.finish_run(req).await.map(|f| Output::Finished {
                record: run_view(&f.record),
                first_seq: f.first_seq,
                released: f.released,
            }))
        }
        Input::TakeLease { member, steal } => {
            let req = AcquireLeases {
                member: member_name(member),
                address: format!("http://{}:50062", member_name(member)),
                partitions: vec![partition],
                ttl_ms: LEASE_TTL_MS,
                steal,
            };
            or_refused(
                store
                    .acquire_leases(req)
                    .await
                    .map(|g| lease_answer(g, partition)),
            )
        }
        Input::RenewLease { token } => {
            let req = RenewLeases {
                member: member_name(token.member),
                tokens: owner_token(Some(token)).into_iter().collect(),
                ttl_ms: LEASE_TTL_MS,
            };
            or_refused(
                store
                    .renew_leases(req)
                    .await
                    .map(|g| lease_answer(g, partition)),
            )
        }
        Input::ReleaseLease { token } => {
            let tokens = owner_token(Some(token)).into_iter().collect();
            or_refused(
                store
                    .release_leases(tokens)
                    .await
                    .map(|released| Output::LeaseReleased(released.contains(&partition))),
            )
        }
        Input::ReadLease => or_refused(
            store
                .list_leases()
                .await
                .map(|table| Output::Leases(lease_view(&table.leases[partition as usize]))),
        ),
    }
}

// ---- learning from the answer ---------------------------------------------------

/// Every session view an answer carries.
fn sessions_in(output: &Output) -> Vec<&SessionView> {
    match output {
        Output::Refused(
            Refusal::StaleWriter(Some(v))
            | Refusal::SessionReplaced(Some(v))
            | Refusal::WriterConflict(Some(v)),
        ) => vec![v],
        Output::Acquired(a) | Output::Started { acquired: a, .. } => vec![&a.session],
        Output::Released {
            session: Some(v), ..
        }
        | Output::Appended { session: v, .. }
        | Output::Reset { session: v, .. }
        | Output::Read(Some(v)) => vec![v],
        _ => Vec::new(),
    }
}

fn learn(me: &mut Local, board: &mut Board, part: usize, input: &Input, output: &Output) {
    let g = match input {
        Input::Acquire { s, .. }
        | Input::Release { s, .. }
        | Input::Append { s, .. }
        | Input::Reset { s }
        | Input::Delete { s }
        | Input::Read { s }
        | Input::CreateRun { s, .. }
        | Input::StartRun { s, .. }
        | Input::FinishRun { s, .. } => Some(global(part, *s)),
        _ => None,
    };
    if let Some(g) = g {
        for view in sessions_in(output) {
            board.see_session(g, view);
        }
    }
    match (input, output) {
        (_, Output::Lease { lease, .. } | Output::Leases(lease))
        | (_, Output::Refused(Refusal::StaleOwner(Some(lease)))) => board.see_token(part, *lease),
        _ => {}
    }
    if let Output::LeaseReleased(true) | Output::Lease { granted: true, .. } = output {
        me.probe = Some(part);
    }
    let Some(g) = g else { return };
    match (input, output) {
        (Input::Acquire { run, .. }, Output::Acquired(a)) => {
            let grant = Grant {
                sid: a.session.id,
                run: *run,
                fence: a.fence,
            };
            board.see_grant(g, grant);
            me.held[g] = Some(grant);
        }
        // A refused writer gives up its fence, as a coordinator would.
        (Input::Append { run, fence, .. }, Output::Refused(_))
        | (Input::Release { run, fence, .. }, Output::Released { .. })
            if me.held[g].is_some_and(|h| h.run == *run && h.fence == *fence) =>
        {
            me.held[g] = None;
        }
        (Input::CreateRun { run, .. }, Output::RunCreated { record, .. }) => {
            if let Some(mine) = me.run_mut(*run) {
                mine.version = record.version;
            }
            board.see_run(*run, g, record.version);
        }
        (
            Input::StartRun { run, .. },
            Output::Started {
                record, acquired, ..
            },
        ) => {
            let grant = Grant {
                sid: acquired.session.id,
                run: *run,
                fence: acquired.fence,
            };
            board.see_grant(g, grant);
            me.held[g] = Some(grant);
            if let Some(mine) = me.run_mut(*run) {
                mine.version = record.version;
                mine.writer = Some((grant.sid, grant.fence));
                mine.started = true;
            }
            board.see_run(*run, g, record.version);
        }
        (Input::FinishRun { run, writer, .. }, Output::Finished { record, .. }) => {
            if let Some(mine) = me.run_mut(*run) {
                mine.version = record.version;
                mine.finished = true;
            }
            if let Some((_, fence)) = writer
                && me.held[g].is_some_and(|h| h.run == *run && h.fence == *fence)
            {
                me.held[g] = None;
            }
            board.see_run(*run, g, record.version);
        }
        (
            Input::StartRun { run, .. } | Input::FinishRun { run, .. },
            Output::Refused(Refusal::RunVersionConflict(record) | Refusal::RunTerminal(record)),
        ) => {
            if let Some(mine) = me.run_mut(*run) {
                mine.version = record.version;
                mine.finished |= record.status.is_terminal();
            }
            board.see_run(*run, g, record.version);
        }
        _ => {}
    }
}

// ---- the run ----------------------------------------------------------------

struct Shared {
    layout: Layout,
    board: Mutex<Board>,
    /// The global logical clock: every call and every answer takes a tick.
    clock: AtomicU64,
    seed: u64,
}

/// One recorded operation: its partition, its id (which tags its entries).
struct Recorded {
    part: usize,
    id: u64,
    op: Operation<Input, Output>,
}

async fn client(
    shared: Arc<Shared>,
    task: usize,
    store: Arc<dyn SessionStore>,
    count: usize,
) -> Vec<Recorded> {
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
        let (part, input) = {
            let board = shared.board.lock().unwrap();
            choose(&mut rng, &mut me, &board, sessions)
        };
        let id = task as u64 * 1_000_000 + i as u64;
        let call = shared.clock.fetch_add(1, Ordering::SeqCst);
        let output = perform(&*store, &shared.layout, part, &input, id, seed).await;
        let ret = shared.clock.fetch_add(1, Ordering::SeqCst);
        learn(
            &mut me,
            &mut shared.board.lock().unwrap(),
            part,
            &input,
            &output,
        );
        recorded.push(Recorded {
            part,
            id,
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

/// A transcript's expected content: its session, and seq → (tag, run).
type Expected = (usize, BTreeMap<u64, (String, Run)>);

/// Every transcript must hold exactly the entries of the acknowledged
/// appends (Append, StartRun, FinishRun), at the seqs they were given, by
/// the run that wrote them; nothing a refused write carried. Returns the
/// transcripts and entries checked.
async fn verify_transcripts(
    store: &dyn SessionStore,
    layout: &Layout,
    recorded: &[Recorded],
    seed: u64,
) -> (usize, usize) {
    let mut expected: HashMap<u128, Expected> = HashMap::new();
    for r in recorded {
        let g_of = |s: u8| global(r.part, s);
        let mut expect = |g: usize, sid: Sid, first: u64, count: u64, run: Run| {
            let (_, entries) = expected
                .entry(sid.0)
                .or_insert_with(|| (g, BTreeMap::new()));
            for i in 0..count {
                entries.insert(first + i, (tag(r.id, i), run));
            }
        };
        match (&r.op.input, &r.op.output) {
            (
                Input::Append {
                    s, sid, run, count, ..
                },
                Output::Appended { first, .. },
            ) => expect(g_of(*s), *sid, *first, *count, *run),
            (
                Input::StartRun { s, run, count, .. },
                Output::Started {
                    acquired,
                    first_seq,
                    ..
                },
            ) => expect(g_of(*s), acquired.session.id, *first_seq, *count, *run),
            (
                Input::FinishRun {
                    s,
                    run,
                    count,
                    writer: Some((sid, _)),
                    ..
                },
                Output::Finished { first_seq, .. },
            ) => expect(g_of(*s), *sid, *first_seq, *count, *run),
            _ => {}
        }
        let g = match &r.op.input {
            Input::Acquire { s, .. }
            | Input::Release { s, .. }
            | Input::Append { s, .. }
            | Input::Reset { s }
            | Input::Delete { s }
            | Input::Read { s }
            | Input::CreateRun { s, .. }
            | Input::StartRun { s, .. }
            | Input::FinishRun { s, .. } => global(r.part, *s),
            _ => continue,
        };
        let mut ids: Vec<Sid> = sessions_in(&r.op.output).iter().map(|v| v.id).collect();
        if let Output::Reset {
            previous: Some(id), ..
        }
        | Output::Deleted {
            previous: Some(id), ..
        } = &r.op.output
        {
            ids.push(*id);
        }
        for id in ids {
            expected.entry(id.0).or_insert_with(|| (g, BTreeMap::new()));
        }
    }
    let mut entries_checked = 0;
    for (sid, (g, wanted)) in &expected {
        let id = uuid::Uuid::from_u128(*sid);
        let found = suite::transcript(store, &layout.keys[*g], Some(id)).await;
        for (index, entry) in found.iter().enumerate() {
            assert_eq!(
                entry.seq,
                index as u64 + 1,
                "seed {seed}: {id}: seqs have a gap"
            );
            let text = suite::text_of(entry);
            let Some((tag, run)) = wanted.get(&entry.seq) else {
                panic!(
                    "seed {seed}: {id} seq {} holds {text:?} by {}, which no acknowledged write put there",
                    entry.seq, entry.run_id
                );
            };
            assert_eq!(
                (&text, entry.run_id.as_str()),
                (tag, run_name(*run).as_str()),
                "seed {seed}: {id} seq {}",
                entry.seq
            );
        }
        assert_eq!(
            found.len(),
            wanted.len(),
            "seed {seed}: {id}: acknowledged entries are missing"
        );
        entries_checked += found.len();
    }
    (expected.len(), entries_checked)
}

/// Counts by kind, and by kind and answer (`ok` or the refusal's code).
fn tally(recorded: &[Recorded]) -> (BTreeMap<&'static str, usize>, BTreeMap<&'static str, usize>) {
    let mut by_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut refusals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in recorded {
        *by_kind.entry(r.op.input.kind()).or_default() += 1;
        if let Output::Refused(refusal) = &r.op.output {
            *refusals.entry(refusal.code()).or_default() += 1;
        }
    }
    (by_kind, refusals)
}

fn describe_answers(recorded: &[Recorded]) -> String {
    let mut answers: BTreeMap<&'static str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for r in recorded {
        let answer = match &r.op.output {
            Output::Refused(refusal) => refusal.code(),
            Output::Released {
                released: false, ..
            }
            | Output::Lease { granted: false, .. }
            | Output::LeaseReleased(false)
            | Output::Deleted { deleted: false, .. } => "no-op",
            Output::RunCreated { created: false, .. } => "existing",
            _ => "ok",
        };
        *answers
            .entry(r.op.input.kind())
            .or_default()
            .entry(answer)
            .or_default() += 1;
    }
    let mut out = String::new();
    for (kind, counts) in answers {
        let total: usize = counts.values().sum();
        let detail: Vec<String> = counts.iter().map(|(a, n)| format!("{a} {n}")).collect();
        let _ = writeln!(out, "    {kind:<14} {total:>6}: {}", detail.join(", "));
    }
    out
}

/// Writes a partition's history where a failed run can be studied.
fn dump_history(name: &str, seed: u64, partition: u32, ops: &[Operation<Input, Output>]) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("lincheck");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-seed{seed}-partition{partition}.txt"));
    let mut text = String::new();
    for (i, op) in ops.iter().enumerate() {
        let _ = writeln!(
            text,
            "#{i} client {} [{}, {}] {:?} => {:?}",
            op.client, op.call, op.ret, op.input, op.output
        );
    }
    match std::fs::write(&path, text) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(not written: {e})"),
    }
}

async fn lincheck(name: &str, harness: Harness) {
    let cfg = config();
    let layout = Layout::new();
    eprintln!(
        "lincheck {name}: seed {} ({:#x}), {} operations, {} clients over {CONNECTIONS} connections, \
         partitions {:?} with {SESSIONS_PER_PARTITION} sessions each",
        cfg.seed, cfg.seed, cfg.ops, cfg.tasks, layout.partitions
    );
    let reproduce = format!(
        "LINCHECK_SEED={} LINCHECK_OPS={} LINCHECK_TASKS={} cargo test -p session-store --test linearizability linearizable_on_{name} -- --nocapture",
        cfg.seed, cfg.ops, cfg.tasks
    );
    let server = TestServer::start(harness.shared(), Default::default()).await;
    let mut remotes: Vec<Arc<dyn SessionStore>> = Vec::new();
    for _ in 0..CONNECTIONS {
        remotes.push(Arc::new(server.remote().await));
    }
    let shared = Arc::new(Shared {
        board: Mutex::new(Board::new(layout.sessions())),
        layout,
        clock: AtomicU64::new(0),
        seed: cfg.seed,
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..cfg.tasks)
        .map(|task| {
            let count = cfg.ops / cfg.tasks + usize::from(task < cfg.ops % cfg.tasks);
            let store = remotes[task % remotes.len()].clone();
            tokio::spawn(client(shared.clone(), task, store, count))
        })
        .collect();
    let mut recorded = Vec::with_capacity(cfg.ops);
    for c in clients {
        match c.await {
            Ok(ops) => recorded.extend(ops),
            Err(e) => panic!("a client failed ({e}); reproduce with {reproduce}"),
        }
    }
    let ran = started.elapsed();
    let (transcripts, entries) =
        verify_transcripts(&*remotes[0], &shared.layout, &recorded, cfg.seed).await;
    drop(remotes);
    server.stop().await;
    harness.finish().await;

    // One history per partition; record operations learn how many
    // operations name their run.
    let mut uses: HashMap<(usize, Run), u32> = HashMap::new();
    for r in &recorded {
        if let Some(run) = r.op.input.run_of_record() {
            *uses.entry((r.part, run)).or_default() += 1;
        }
    }
    let mut histories: Vec<Vec<Operation<Input, Output>>> = vec![Vec::new(); PARTITIONS];
    for r in &recorded {
        let mut op = r.op.clone();
        if let Some(run) = op.input.run_of_record() {
            op.input.set_uses(uses[&(r.part, run)]);
        }
        histories[r.part].push(op);
    }
    let model = Partition {
        sessions: SESSIONS_PER_PARTITION,
    };
    let check_started = Instant::now();
    let outcomes: Vec<(Result<Stats, _>, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = histories
            .iter()
            .map(|history| {
                let model = &model;
                scope.spawn(move || {
                    let t = Instant::now();
                    (lincheck::check(model, history), t.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let checked = check_started.elapsed();

    let (by_kind, refusals) = tally(&recorded);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "lincheck {name}: seed {}: {} operations in {:.2?} ({:.0} ops/s); answers by kind:",
        cfg.seed,
        recorded.len(),
        ran,
        recorded.len() as f64 / ran.as_secs_f64()
    );
    report.push_str(&describe_answers(&recorded));
    let refusal_list: Vec<String> = refusals.iter().map(|(c, n)| format!("{c} {n}")).collect();
    let _ = writeln!(report, "  refusals: {}", refusal_list.join(", "));
    let _ = writeln!(
        report,
        "  transcripts: {transcripts} sessionIds, {entries} entries, each where its acknowledged write put it"
    );
    let shared_layout = &shared.layout;
    for ((partition, history), (outcome, took)) in shared_layout
        .partitions
        .iter()
        .zip(&histories)
        .zip(&outcomes)
    {
        match outcome {
            Ok(stats) => {
                let _ = writeln!(
                    report,
                    "  partition {partition}: {} operations linearizable, checked in {took:.2?} \
                     ({} steps, {} backtracks, {} configurations)",
                    history.len(),
                    stats.steps,
                    stats.backtracks,
                    stats.cached
                );
            }
            Err(failure) => {
                let _ = writeln!(
                    report,
                    "  partition {partition}: NOT LINEARIZABLE ({} operations, checked in {took:.2?})",
                    history.len()
                );
                let _ = writeln!(report, "{}", lincheck::explain(&model, history, failure));
                let path = dump_history(name, cfg.seed, *partition, history);
                let _ = writeln!(report, "  the partition's whole history: {path}");
            }
        }
    }
    let _ = writeln!(report, "  check: {checked:.2?} for both partitions");
    eprint!("{report}");
    if outcomes.iter().any(|(o, _)| o.is_err()) {
        panic!("{name}: the history is not linearizable; reproduce with {reproduce}");
    }
    for kind in KINDS {
        assert!(
            by_kind.get(kind).is_some_and(|n| *n > 0),
            "{name}: no {kind} happened; reproduce with {reproduce}"
        );
    }
    for code in REFUSALS_EXPECTED {
        assert!(
            refusals.get(code).is_some_and(|n| *n > 0),
            "{name}: no {code} refusal happened, so the run proves little; reproduce with {reproduce}"
        );
    }
    let ok = |kind: &str| {
        recorded
            .iter()
            .filter(|r| r.op.input.kind() == kind && !matches!(r.op.output, Output::Refused(_)))
            .count()
    };
    for kind in ["append", "takeover", "start_run", "finish_run"] {
        assert!(
            ok(kind) > 0,
            "{name}: no {kind} succeeded; reproduce with {reproduce}"
        );
    }
    let epochs = recorded
        .iter()
        .filter(|r| matches!(r.op.output, Output::Lease { granted: true, .. }))
        .filter(|r| matches!(r.op.input, Input::TakeLease { .. }))
        .count();
    assert!(
        epochs > 1,
        "{name}: the epoch hardly changed; reproduce with {reproduce}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_embedded() {
    lincheck("embedded", harness::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_postgres() {
    lincheck("postgres", harness::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_memory() {
    lincheck("memory", harness::memory().await).await;
}

/// ReleaseLeases on PostgreSQL with a write of the released tenure in
/// flight, the interleaving the randomized run above found, forced: the
/// write has passed its owner check and waits for its session row (held by
/// another connection, as a concurrent write would); the release is called;
/// once it has answered (or, if it waits for the write, once it does), the
/// session is read; then the row is let go. Whatever the store does, the
/// history must be linearizable: either the release waits for the write,
/// or the write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lease_release_is_ordered_after_the_writes_of_its_tenure() {
    use session_store::backend::postgres::{self, PgOptions, PostgresStore};

    let schema = format!("sstest_{}", uuid::Uuid::new_v4().simple());
    let url = harness::postgres_url();
    let options = PgOptions {
        schema: Some(schema.clone()),
        ..PgOptions::default()
    };
    let store = PostgresStore::connect(&url, options)
        .await
        .expect("connect to PostgreSQL (is it running? see README)");
    let server = TestServer::start(Arc::new(store), Default::default()).await;
    let remote: Arc<dyn SessionStore> = Arc::new(server.remote().await);
    let layout = Arc::new(Layout::new());
    let clock = Arc::new(AtomicU64::new(0));
    let tick = |clock: &AtomicU64| clock.fetch_add(1, Ordering::SeqCst);
    // Performs one operation on the first partition, recorded.
    let record = |input: Input| {
        let (remote, layout, clock) = (remote.clone(), layout.clone(), clock.clone());
        async move {
            let call = tick(&clock);
            let output = perform(&*remote, &layout, 0, &input, call, 0).await;
            let ret = tick(&clock);
            Operation {
                client: call as usize,
                input,
                call,
                output,
                ret,
            }
        }
    };
    let mut history = Vec::new();

    let take = record(Input::TakeLease {
        member: 0,
        steal: false,
    })
    .await;
    let Output::Lease {
        granted: true,
        lease,
    } = take.output
    else {
        panic!("the lease was not granted: {take:?}")
    };
    let token = Token {
        member: 0,
        epoch: lease.epoch,
    };
    history.push(take);
    let acquire = record(Input::Acquire {
        s: 0,
        expect: None,
        expected_writer: None,
        run: 1,
        takeover: false,
        token: Some(token),
    })
    .await;
    let Output::Acquired(held) = &acquire.output else {
        panic!("the acquire failed: {acquire:?}")
    };
    let append = Input::Append {
        s: 0,
        sid: held.session.id,
        run: 1,
        fence: held.fence,
        count: 1,
        token: Some(token),
    };
    history.push(acquire);

    // Another connection holds the session row, as a write in progress would.
    let connect = || async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(connection);
        client
    };
    let blocker = connect().await;
    let monitor = connect().await;
    blocker
        .batch_execute(&format!("SET search_path TO \"{schema}\"; BEGIN"))
        .await
        .unwrap();
    let blocker_pid: i32 = blocker
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let key = layout.keys[global(0, 0)].as_str().to_owned();
    blocker
        .execute(
            "SELECT 1 FROM sessions WHERE session_key = $1 FOR UPDATE",
            &[&key],
        )
        .await
        .unwrap();
    let blocked_by = |pid: i32| {
        let monitor = &monitor;
        async move {
            monitor
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&pid],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get::<_, i32>(0))
                .collect::<Vec<i32>>()
        }
    };
    // A bound so that a store that blocks elsewhere fails the test instead
    // of hanging it; the outcome never depends on it.
    let give_up = Duration::from_secs(120);
    let appending = tokio::spawn(record(append));
    // The append has passed its owner check and waits for the row.
    let append_pid = wait_for("the append to wait for the row", give_up, async || {
        let pid = blocked_by(blocker_pid).await.first().copied();
        assert!(
            pid.is_some() || !appending.is_finished(),
            "the append did not wait for the row"
        );
        pid
    })
    .await;
    let releasing = tokio::spawn(record(Input::ReleaseLease { token }));
    // Either the release answers, or it waits for the append.
    let what = "the release to answer or to wait for the append";
    let release_waits = wait_for(what, give_up, async || {
        if releasing.is_finished() {
            return Some(false);
        }
        (!blocked_by(append_pid).await.is_empty()).then_some(true)
    })
    .await;
    if release_waits {
        blocker.batch_execute("COMMIT").await.unwrap();
        history.push(appending.await.unwrap());
        history.push(releasing.await.unwrap());
        history.push(record(Input::Read { s: 0 }).await);
    } else {
        history.push(releasing.await.unwrap());
        history.push(record(Input::Read { s: 0 }).await);
        blocker.batch_execute("COMMIT").await.unwrap();
        history.push(appending.await.unwrap());
    }
    drop((blocker, monitor, remote));
    server.stop().await;
    postgres::drop_schema(&url, &schema)
        .await
        .expect("drop test schema");

    let model = Partition {
        sessions: SESSIONS_PER_PARTITION,
    };
    let mut text = String::new();
    for op in &history {
        let _ = writeln!(
            text,
            "  [{}, {}] {:?}\n      => {:?}",
            op.call, op.ret, op.input, op.output
        );
    }
    if let Err(failure) = lincheck::check(&model, &history) {
        panic!(
            "ReleaseLeases answered (waited for the write in flight: {release_waits}) \
             while a write of its tenure was in flight, and that write then succeeded:\n{text}\n{}",
            lincheck::explain(&model, &history, &failure)
        );
    }
}

//! What the clients know, and the operations they choose from it.

use super::*;

// ---- what the clients know ----------------------------------------------------

/// A fence somebody was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub sid: Sid,
    pub run: Run,
    pub fence: u64,
}

/// What every client has seen, shared: clients use it to send what real
/// callers would (the current token, the current writer), but also stale
/// values, which the store must refuse.
pub struct Board {
    /// Per partition, every token seen, by epoch.
    pub tokens: Vec<Vec<Token>>,
    /// Per session, every sessionId seen, newest last.
    pub ids: Vec<Vec<Sid>>,
    /// Per session, recent fences issued.
    pub grants: Vec<Vec<Grant>>,
    /// Per session, the writer last seen.
    pub writer: Vec<Option<Run>>,
    /// Recent runs: (run, session, version last seen).
    pub runs: Vec<(Run, usize, u64)>,
}

impl Board {
    pub fn new(sessions: usize) -> Self {
        Self {
            tokens: vec![Vec::new(); PARTITIONS],
            ids: vec![Vec::new(); sessions],
            grants: vec![Vec::new(); sessions],
            writer: vec![None; sessions],
            runs: Vec::new(),
        }
    }

    pub fn see_token(&mut self, part: usize, lease: LeaseView) {
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

    pub fn see_session(&mut self, g: usize, view: &SessionView) {
        if !self.ids[g].contains(&view.id) {
            self.ids[g].push(view.id);
        }
        self.writer[g] = view.writer;
    }

    pub fn see_grant(&mut self, g: usize, grant: Grant) {
        let grants = &mut self.grants[g];
        grants.push(grant);
        if grants.len() > 16 {
            grants.remove(0);
        }
    }

    pub fn see_run(&mut self, run: Run, g: usize, version: u64) {
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
pub struct MyRun {
    pub run: Run,
    pub g: usize,
    pub version: u64,
    pub writer: Option<(Sid, u64)>,
    pub started: bool,
    pub finished: bool,
}

/// One client's own knowledge.
pub struct Local {
    pub member: Member,
    /// Per session, the fence this client holds (as far as it knows).
    pub held: Vec<Option<Grant>>,
    pub runs: Vec<MyRun>,
    pub next_run: Run,
    /// A read to make next: after a lease changed hands, whether the writes
    /// of the tenure before are all in (or all out) is what a read shows.
    pub probe: Option<usize>,
}

impl Local {
    pub fn new_run(&mut self) -> Run {
        self.next_run += 1;
        self.next_run
    }

    pub fn run_mut(&mut self, run: Run) -> Option<&mut MyRun> {
        self.runs.iter_mut().find(|r| r.run == run)
    }
}

// ---- choosing an operation ------------------------------------------------------

#[derive(Debug, Clone, Copy)]
pub enum Kind {
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
pub const MIX: [(Kind, u64); 14] = [
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
pub fn token_for(rng: &mut Rng, board: &Board, part: usize, member: Member) -> Option<Token> {
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
pub fn version_near(rng: &mut Rng, known: u64) -> u64 {
    match rng.below(100) {
        0..80 => known,
        80..90 => known + 1,
        _ => known.saturating_sub(1).max(1),
    }
}

pub fn choose(rng: &mut Rng, me: &mut Local, board: &Board, sessions: usize) -> (usize, Input) {
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

// ---- learning from the answer ---------------------------------------------------

/// Every session view an answer carries.
pub fn sessions_in(output: &Output) -> Vec<&SessionView> {
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

pub fn learn(me: &mut Local, board: &mut Board, part: usize, input: &Input, output: &Output) {
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

//! The sequential specification of one partition of the session store: its
//! lease (owner, epoch) and its sessions' writer fences, transcripts' lengths
//! and the run records written through them.
//!
//! It is written from the documented contract (`docs/session-store.md`,
//! `docs/high-availability.md`), in the order the rules decide: the owner
//! check of a write first, then the record, then the fence. A refusal
//! changes nothing. Lease expiry is left out: the tests take leases for an
//! hour, so an owned lease is never free by time.
//!
//! A partition is a separate object: every operation touches one partition
//! (its session's, or the one lease it names), and nothing of one partition
//! decides anything in another. Linearizability is local (Herlihy & Wing),
//! so the store is linearizable when each partition's history is.

use std::fmt;

use session_store::model::RunStatus;

use super::Model;

/// A run id `r<n>`.
pub type Run = u32;
/// A member id `m<n>`.
pub type Member = u8;

/// A sessionId (a UUID), shown by its first 8 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sid(pub u128);

impl fmt::Debug for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", (self.0 >> 96) as u32)
    }
}

/// An owner token of this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub member: Member,
    pub epoch: u64,
}

/// A session as the store shows it (the fields the model decides; times,
/// labels and settings are not modelled).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionView {
    pub id: Sid,
    pub writer: Option<Run>,
    /// The key's last fence issued.
    pub fence: u64,
    pub entries: u64,
    pub last_run: Option<Run>,
    pub last_status: Option<RunStatus>,
}

/// A run record as the store shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunView {
    pub status: RunStatus,
    pub version: u64,
    pub owner: Member,
    pub sid: Option<Sid>,
    pub fence: Option<u64>,
}

/// A lease as the store shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseView {
    pub owner: Option<Member>,
    pub epoch: u64,
}

/// A refusal, with the current state it carries in its detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    StaleWriter(Option<SessionView>),
    SessionReplaced(Option<SessionView>),
    WriterConflict(Option<SessionView>),
    StaleOwner(Option<LeaseView>),
    RunNotFound,
    RunVersionConflict(RunView),
    RunTerminal(RunView),
    /// INVALID_ARGUMENT: the tests send none, so the model never answers it.
    Invalid,
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::StaleWriter(_) => "STALE_WRITER",
            Self::SessionReplaced(_) => "SESSION_REPLACED",
            Self::WriterConflict(_) => "WRITER_CONFLICT",
            Self::StaleOwner(_) => "STALE_OWNER",
            Self::RunNotFound => "RUN_NOT_FOUND",
            Self::RunVersionConflict(_) => "RUN_VERSION_CONFLICT",
            Self::RunTerminal(_) => "RUN_TERMINAL",
            Self::Invalid => "INVALID_ARGUMENT",
        }
    }
}

/// An operation on the partition. `s` is a session of the partition (0..).
/// `uses` (record operations) is how many operations of the whole history
/// name that run's record: once all of them are placed, the model forgets
/// the record (nothing can read it any more), which keeps its state small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// AcquireWriter; `expect`: `None` = the current sessionId.
    Acquire {
        s: u8,
        expect: Option<Sid>,
        expected_writer: Option<Run>,
        run: Run,
        takeover: bool,
        token: Option<Token>,
    },
    Release {
        s: u8,
        run: Run,
        fence: u64,
        token: Option<Token>,
    },
    Append {
        s: u8,
        sid: Sid,
        run: Run,
        fence: u64,
        count: u64,
        token: Option<Token>,
    },
    Reset {
        s: u8,
    },
    /// DeleteSession, keeping the transcript.
    Delete {
        s: u8,
    },
    /// GetSession.
    Read {
        s: u8,
    },
    CreateRun {
        s: u8,
        run: Run,
        owner: Member,
        token: Option<Token>,
        uses: u32,
    },
    StartRun {
        s: u8,
        run: Run,
        version: u64,
        owner: Member,
        takeover: bool,
        expected_writer: Option<Run>,
        count: u64,
        history: u32,
        token: Option<Token>,
        uses: u32,
    },
    FinishRun {
        s: u8,
        run: Run,
        version: u64,
        status: RunStatus,
        writer: Option<(Sid, u64)>,
        count: u64,
        token: Option<Token>,
        uses: u32,
    },
    /// AcquireLeases of this partition.
    TakeLease {
        member: Member,
        steal: bool,
    },
    RenewLease {
        token: Token,
    },
    ReleaseLease {
        token: Token,
    },
    /// ListLeases, this partition's row.
    ReadLease,
}

impl Input {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Acquire {
                takeover: false, ..
            } => "acquire",
            Self::Acquire { takeover: true, .. } => "takeover",
            Self::Release { .. } => "release",
            Self::Append { .. } => "append",
            Self::Reset { .. } => "reset",
            Self::Delete { .. } => "delete",
            Self::Read { .. } => "get_session",
            Self::CreateRun { .. } => "create_run",
            Self::StartRun { .. } => "start_run",
            Self::FinishRun { .. } => "finish_run",
            Self::TakeLease { .. } => "take_lease",
            Self::RenewLease { .. } => "renew_lease",
            Self::ReleaseLease { .. } => "release_lease",
            Self::ReadLease => "list_leases",
        }
    }

    /// The run whose record this operation reads or writes, with `uses`.
    fn record_use(&self) -> Option<(Run, u32)> {
        match self {
            Self::CreateRun { run, uses, .. }
            | Self::StartRun { run, uses, .. }
            | Self::FinishRun { run, uses, .. } => Some((*run, *uses)),
            _ => None,
        }
    }

    /// Sets `uses` of a record operation.
    pub fn set_uses(&mut self, count: u32) {
        match self {
            Self::CreateRun { uses, .. }
            | Self::StartRun { uses, .. }
            | Self::FinishRun { uses, .. } => *uses = count,
            _ => {}
        }
    }

    pub fn run_of_record(&self) -> Option<Run> {
        self.record_use().map(|(run, _)| run)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub fence: u64,
    pub session: SessionView,
    pub superseded: Option<Run>,
    pub created: bool,
}

/// What an operation answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Refused(Refusal),
    Acquired(Acquired),
    Released {
        released: bool,
        session: Option<SessionView>,
    },
    Appended {
        first: u64,
        last: u64,
        session: SessionView,
    },
    Reset {
        session: SessionView,
        previous: Option<Sid>,
        superseded: Option<Run>,
    },
    Deleted {
        deleted: bool,
        previous: Option<Sid>,
        superseded: Option<Run>,
    },
    Read(Option<SessionView>),
    RunCreated {
        created: bool,
        record: RunView,
    },
    Started {
        record: RunView,
        acquired: Acquired,
        first_seq: u64,
        /// The seqs of the history returned.
        history: Vec<u64>,
    },
    Finished {
        record: RunView,
        first_seq: u64,
        released: bool,
    },
    /// AcquireLeases / RenewLeases: granted or refused, and the lease.
    Lease {
        granted: bool,
        lease: LeaseView,
    },
    LeaseReleased(bool),
    Leases(LeaseView),
}

impl Output {
    /// A sessionId the answer reports for a session it may have made (the
    /// store picks sessionIds; the model takes them from the answer).
    fn fresh_id(&self) -> Option<Sid> {
        match self {
            Self::Acquired(a) | Self::Started { acquired: a, .. } => Some(a.session.id),
            Self::Reset { session, .. } => Some(session.id),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Writer {
    run: Run,
    fence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Current {
    id: Sid,
    writer: Option<Writer>,
    entries: u64,
    last_run: Option<Run>,
    last_status: Option<RunStatus>,
}

impl Current {
    fn fresh(id: Sid) -> Self {
        Self {
            id,
            writer: None,
            entries: 0,
            last_run: None,
            last_status: None,
        }
    }
}

/// A session key's persisted state: it outlives resets and deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Slot {
    last_fence: u64,
    current: Option<Current>,
}

impl Slot {
    fn view(&self) -> Option<SessionView> {
        let c = self.current.as_ref()?;
        Some(SessionView {
            id: c.id,
            writer: c.writer.as_ref().map(|w| w.run),
            fence: self.last_fence,
            entries: c.entries,
            last_run: c.last_run,
            last_status: c.last_status,
        })
    }

    /// The fence check of a transcript write; reserves `count` seqs.
    fn reserve(&mut self, sid: Sid, run: Run, fence: u64, count: u64) -> Result<u64, Refusal> {
        let view = self.view();
        let Some(c) = self.current.as_mut() else {
            return Err(Refusal::SessionReplaced(None));
        };
        if c.id != sid {
            return Err(Refusal::SessionReplaced(view));
        }
        if c.writer != Some(Writer { run, fence }) {
            return Err(Refusal::StaleWriter(view));
        }
        let first = c.entries + 1;
        c.entries += count;
        Ok(first)
    }

    /// AcquireWriter's rule, after the owner check.
    fn acquire(
        &mut self,
        expect: Option<Sid>,
        expected_writer: Option<Run>,
        run: Run,
        takeover: bool,
        fresh: Sid,
    ) -> Result<Acquired, Refusal> {
        let created = match (&self.current, expect) {
            (None, None) => true,
            (None, Some(_)) => return Err(Refusal::SessionReplaced(None)),
            (Some(c), Some(expected)) if c.id != expected => {
                return Err(Refusal::SessionReplaced(self.view()));
            }
            (Some(_), _) => false,
        };
        let holder = self
            .current
            .as_ref()
            .and_then(|c| c.writer.as_ref())
            .map(|w| w.run);
        if !takeover && holder != expected_writer {
            return Err(Refusal::WriterConflict(self.view()));
        }
        if created {
            self.current = Some(Current::fresh(fresh));
        }
        self.last_fence += 1;
        let fence = self.last_fence;
        let c = self.current.as_mut().expect("a session exists here");
        c.writer = Some(Writer { run, fence });
        c.last_run = Some(run);
        c.last_status = Some(RunStatus::Running);
        Ok(Acquired {
            fence,
            session: self.view().expect("a session exists here"),
            superseded: holder.filter(|h| *h != run),
            created,
        })
    }

    fn release(&mut self, run: Run, fence: u64) -> bool {
        match self.current.as_mut() {
            Some(c) if c.writer == Some(Writer { run, fence }) => {
                c.writer = None;
                true
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Record {
    status: RunStatus,
    version: u64,
    owner: Member,
    sid: Option<Sid>,
    fence: Option<u64>,
}

impl Record {
    fn view(&self) -> RunView {
        RunView {
            status: self.status,
            version: self.version,
            owner: self.owner,
            sid: self.sid,
            fence: self.fence,
        }
    }

    /// UpdateRun's CAS: terminal records never change.
    fn check_update(&self, expected_version: u64) -> Result<(), Refusal> {
        if self.status.is_terminal() {
            return Err(Refusal::RunTerminal(self.view()));
        }
        if self.version != expected_version {
            return Err(Refusal::RunVersionConflict(self.view()));
        }
        Ok(())
    }
}

/// A run the history still names: how many of its record operations are
/// placed, and its record if one was created.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Live {
    run: Run,
    placed: u32,
    record: Option<Record>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    lease: LeaseView,
    slots: Vec<Slot>,
    /// Sorted by run.
    runs: Vec<Live>,
}

impl State {
    fn owner_check(&self, token: Option<Token>) -> Result<(), Refusal> {
        let lease = self.lease;
        let ok = match token {
            None => lease.epoch == 0,
            Some(t) => lease.epoch == t.epoch && lease.owner == Some(t.member),
        };
        match ok {
            true => Ok(()),
            false => Err(Refusal::StaleOwner(Some(lease))),
        }
    }

    fn holds(&self, token: Token) -> bool {
        self.lease.epoch == token.epoch && self.lease.owner == Some(token.member)
    }

    fn live(&mut self, run: Run) -> &mut Live {
        let at = match self.runs.binary_search_by_key(&run, |l| l.run) {
            Ok(at) => at,
            Err(at) => {
                self.runs.insert(
                    at,
                    Live {
                        run,
                        placed: 0,
                        record: None,
                    },
                );
                at
            }
        };
        &mut self.runs[at]
    }

    fn record(&mut self, run: Run) -> Option<Record> {
        self.live(run).record.clone()
    }

    /// Counts a placed record operation; forgets the run after its last.
    fn note_use(&mut self, run: Run, uses: u32) {
        let live = self.live(run);
        live.placed += 1;
        if live.placed >= uses {
            self.runs.retain(|l| l.run != run);
        }
    }
}

/// The seqs StartRun returns as history (`rules::start_history_range`).
fn start_history(first_seq: u64, total: u64, limit: u32) -> Vec<u64> {
    if limit == 0 {
        return Vec::new();
    }
    let upper = match first_seq {
        0 => total,
        first => (first - 1).min(total),
    };
    if upper == 0 {
        return Vec::new();
    }
    let lower = upper.saturating_sub(u64::from(limit) - 1).max(1);
    (lower..=upper).collect()
}

/// One partition with `sessions` session keys.
pub struct Partition {
    pub sessions: usize,
}

impl Partition {
    /// Applies `input` to `state` and returns the specified answer, or
    /// `None` when no answer fits (a fresh sessionId the store reports that
    /// is not fresh). `fresh`: the sessionId of a session this operation
    /// makes, as the store reported it.
    fn apply(&self, state: &mut State, input: &Input, fresh: Option<Sid>) -> Option<Output> {
        let out = match *input {
            Input::Acquire {
                s,
                expect,
                expected_writer,
                run,
                takeover,
                token,
            } => {
                if let Err(refusal) = state.owner_check(token) {
                    return Some(Output::Refused(refusal));
                }
                let slot = &mut state.slots[s as usize];
                let mut next = slot.clone();
                // Only a session made here needs the reported sessionId.
                let id = fresh.unwrap_or(Sid(0));
                match next.acquire(expect, expected_writer, run, takeover, id) {
                    Ok(acquired) if acquired.created && fresh.is_none() => return None,
                    Ok(acquired) => {
                        *slot = next;
                        Output::Acquired(acquired)
                    }
                    Err(refusal) => Output::Refused(refusal),
                }
            }
            Input::Release {
                s,
                run,
                fence,
                token,
            } => {
                if let Err(refusal) = state.owner_check(token) {
                    return Some(Output::Refused(refusal));
                }
                let slot = &mut state.slots[s as usize];
                let released = slot.release(run, fence);
                Output::Released {
                    released,
                    session: slot.view(),
                }
            }
            Input::Append {
                s,
                sid,
                run,
                fence,
                count,
                token,
            } => {
                if let Err(refusal) = state.owner_check(token) {
                    return Some(Output::Refused(refusal));
                }
                let slot = &mut state.slots[s as usize];
                match slot.reserve(sid, run, fence, count) {
                    Ok(first) => Output::Appended {
                        first,
                        last: first + count - 1,
                        session: slot.view().expect("the append checked the session"),
                    },
                    Err(refusal) => Output::Refused(refusal),
                }
            }
            Input::Reset { s } => {
                let slot = &mut state.slots[s as usize];
                let old = slot.current.take();
                let fresh = fresh?;
                if old.as_ref().is_some_and(|o| o.id == fresh) {
                    return None;
                }
                slot.current = Some(Current::fresh(fresh));
                Output::Reset {
                    session: slot.view().expect("a session exists here"),
                    previous: old.as_ref().map(|o| o.id),
                    superseded: old.and_then(|o| o.writer).map(|w| w.run),
                }
            }
            Input::Delete { s } => {
                let old = state.slots[s as usize].current.take();
                Output::Deleted {
                    deleted: old.is_some(),
                    previous: old.as_ref().map(|o| o.id),
                    superseded: old.and_then(|o| o.writer).map(|w| w.run),
                }
            }
            Input::Read { s } => Output::Read(state.slots[s as usize].view()),
            Input::CreateRun {
                run,
                owner,
                token,
                uses,
                ..
            } => {
                let out = match state.owner_check(token) {
                    Err(refusal) => Output::Refused(refusal),
                    Ok(()) => {
                        let live = state.live(run);
                        match &live.record {
                            Some(existing) => Output::RunCreated {
                                created: false,
                                record: existing.view(),
                            },
                            None => {
                                let record = Record {
                                    status: RunStatus::Accepted,
                                    version: 1,
                                    owner,
                                    sid: None,
                                    fence: None,
                                };
                                let view = record.view();
                                live.record = Some(record);
                                Output::RunCreated {
                                    created: true,
                                    record: view,
                                }
                            }
                        }
                    }
                };
                state.note_use(run, uses);
                out
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
                uses,
            } => {
                let out = self.start_run(
                    state,
                    s,
                    run,
                    version,
                    owner,
                    takeover,
                    expected_writer,
                    count,
                    history,
                    token,
                    fresh,
                );
                state.note_use(run, uses);
                out?
            }
            Input::FinishRun {
                s,
                run,
                version,
                status,
                writer,
                count,
                token,
                uses,
            } => {
                let out = Self::finish_run(state, s, run, version, status, writer, count, token);
                state.note_use(run, uses);
                out
            }
            Input::TakeLease { member, steal } => {
                let lease = &mut state.lease;
                let granted = lease.owner.is_none() || lease.owner == Some(member) || steal;
                if granted {
                    lease.epoch += 1;
                    lease.owner = Some(member);
                }
                Output::Lease {
                    granted,
                    lease: *lease,
                }
            }
            Input::RenewLease { token } => Output::Lease {
                granted: state.holds(token),
                lease: state.lease,
            },
            Input::ReleaseLease { token } => {
                let released = state.holds(token);
                if released {
                    state.lease.owner = None;
                }
                Output::LeaseReleased(released)
            }
            Input::ReadLease => Output::Leases(state.lease),
        };
        Some(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        state: &mut State,
        s: u8,
        run: Run,
        version: u64,
        owner: Member,
        takeover: bool,
        expected_writer: Option<Run>,
        count: u64,
        history: u32,
        token: Option<Token>,
        fresh: Option<Sid>,
    ) -> Option<Output> {
        let refused = |refusal| Some(Output::Refused(refusal));
        if let Err(refusal) = state.owner_check(token) {
            return refused(refusal);
        }
        let Some(mut record) = state.record(run) else {
            return refused(Refusal::RunNotFound);
        };
        if let Err(refusal) = record.check_update(version) {
            return refused(refusal);
        }
        let mut slot = state.slots[s as usize].clone();
        // Only a session made here needs the reported sessionId.
        let id = fresh.unwrap_or(Sid(0));
        let mut acquired = match slot.acquire(None, expected_writer, run, takeover, id) {
            Ok(acquired) => acquired,
            Err(refusal) => return refused(refusal),
        };
        if acquired.created && fresh.is_none() {
            return None;
        }
        let first_seq = match count {
            0 => 0,
            count => slot
                .reserve(acquired.session.id, run, acquired.fence, count)
                .expect("the new fence holds"),
        };
        acquired.session = slot.view().expect("a session exists here");
        record.status = RunStatus::Running;
        record.version += 1;
        record.owner = owner;
        record.sid = Some(acquired.session.id);
        record.fence = Some(acquired.fence);
        let view = record.view();
        let total = acquired.session.entries;
        state.slots[s as usize] = slot;
        state.live(run).record = Some(record);
        Some(Output::Started {
            record: view,
            acquired,
            first_seq,
            history: start_history(first_seq, total, history),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_run(
        state: &mut State,
        s: u8,
        run: Run,
        version: u64,
        status: RunStatus,
        writer: Option<(Sid, u64)>,
        count: u64,
        token: Option<Token>,
    ) -> Output {
        if let Err(refusal) = state.owner_check(token) {
            return Output::Refused(refusal);
        }
        let Some(mut record) = state.record(run) else {
            return Output::Refused(Refusal::RunNotFound);
        };
        assert!(
            status.is_terminal(),
            "the tests finish runs with a terminal status"
        );
        let mut slot = state.slots[s as usize].clone();
        let first_seq = match (count, writer) {
            (0, _) => 0,
            (count, Some((sid, fence))) => match slot.reserve(sid, run, fence, count) {
                Ok(first) => first,
                Err(refusal) => return Output::Refused(refusal),
            },
            (_, None) => return Output::Refused(Refusal::Invalid),
        };
        if let Err(refusal) = record.check_update(version) {
            return Output::Refused(refusal);
        }
        record.status = status;
        record.version += 1;
        if let Some((sid, fence)) = writer {
            record.sid = Some(sid);
            record.fence = Some(fence);
        }
        let released = writer.is_some_and(|(_, fence)| slot.release(run, fence));
        if let Some(c) = slot.current.as_mut()
            && c.last_run == Some(run)
        {
            c.last_status = Some(status);
        }
        let view = record.view();
        state.slots[s as usize] = slot;
        state.live(run).record = Some(record);
        Output::Finished {
            record: view,
            first_seq,
            released,
        }
    }
}

impl Model for Partition {
    type State = State;
    type Input = Input;
    type Output = Output;

    fn init(&self) -> State {
        State {
            lease: LeaseView {
                owner: None,
                epoch: 0,
            },
            slots: vec![Slot::default(); self.sessions],
            runs: Vec::new(),
        }
    }

    fn step(&self, state: &State, input: &Input, output: &Output) -> Option<State> {
        let mut next = state.clone();
        let expected = self.apply(&mut next, input, output.fresh_id())?;
        (expected == *output).then_some(next)
    }

    fn expected(&self, state: &State, input: &Input, output: &Output) -> String {
        let mut next = state.clone();
        match self.apply(&mut next, input, output.fresh_id()) {
            Some(expected) => format!("{expected:?}"),
            None => "no answer fits (a sessionId that is not fresh)".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Operation, check};
    use super::*;

    const A: Sid = Sid(0xa << 96);
    const B: Sid = Sid(0xb << 96);

    /// A history builder: operations in the order given, each one call and
    /// answer apart from the last unless `overlap` says otherwise.
    struct H {
        ops: Vec<Operation<Input, Output>>,
        model: Partition,
        state: State,
    }

    impl H {
        fn new() -> Self {
            let model = Partition { sessions: 1 };
            let state = model.init();
            Self {
                ops: Vec::new(),
                model,
                state,
            }
        }

        /// A sequential operation that the model answers; returns its answer.
        fn seq(&mut self, input: Input) -> Output {
            let fresh = match input {
                Input::Reset { .. } => Some(B),
                _ => Some(A),
            };
            let out = self
                .model
                .apply(&mut self.state, &input, fresh)
                .expect("an answer");
            self.push(input, out.clone(), None);
            out
        }

        fn push(&mut self, input: Input, output: Output, span: Option<(u64, u64)>) {
            let t = 10 * self.ops.len() as u64 + 1000;
            let (call, ret) = span.unwrap_or((t, t + 1));
            self.ops.push(Operation {
                client: self.ops.len(),
                input,
                call,
                output,
                ret,
            });
        }
    }

    fn acquire(run: Run, takeover: bool) -> Input {
        Input::Acquire {
            s: 0,
            expect: None,
            expected_writer: None,
            run,
            takeover,
            token: None,
        }
    }

    fn append(sid: Sid, run: Run, fence: u64) -> Input {
        Input::Append {
            s: 0,
            sid,
            run,
            fence,
            count: 1,
            token: None,
        }
    }

    fn appended(first: u64, writer: Run, fence: u64, entries: u64) -> Output {
        Output::Appended {
            first,
            last: first,
            session: SessionView {
                id: A,
                writer: Some(writer),
                fence,
                entries,
                last_run: Some(writer),
                last_status: Some(RunStatus::Running),
            },
        }
    }

    #[test]
    fn the_fence_holder_writes_and_a_stale_fence_is_refused() {
        let mut h = H::new();
        let Output::Acquired(first) = h.seq(acquire(1, false)) else {
            panic!()
        };
        assert_eq!((first.fence, first.created), (1, true));
        assert_eq!(h.seq(append(A, 1, 1)), appended(1, 1, 1, 1));
        let Output::Acquired(second) = h.seq(acquire(2, true)) else {
            panic!()
        };
        assert_eq!((second.fence, second.superseded), (2, Some(1)));
        let Output::Refused(Refusal::StaleWriter(Some(current))) = h.seq(append(A, 1, 1)) else {
            panic!()
        };
        assert_eq!((current.writer, current.fence), (Some(2), 2));
        // A CAS acquire expecting nobody loses against the holder.
        let out = h.seq(acquire(3, false));
        assert!(matches!(out, Output::Refused(Refusal::WriterConflict(_))));
        check(&h.model, &h.ops).unwrap();
    }

    #[test]
    fn a_stale_append_that_succeeded_after_the_takeover_answered_is_rejected() {
        let mut h = H::new();
        h.seq(acquire(1, false));
        h.seq(acquire(2, true));
        // The old holder's append succeeded, called after the takeover
        // had answered: not linearizable.
        h.push(append(A, 1, 1), appended(1, 1, 1, 1), None);
        let failure = check(&h.model, &h.ops).unwrap_err();
        assert_eq!(failure.blocked, 2);
        assert_eq!(failure.linearized, 2);
    }

    #[test]
    fn an_append_overlapping_the_takeover_may_come_first() {
        let mut h = H::new();
        h.seq(acquire(1, false));
        // The takeover [20, 60] overlaps the old holder's append [30, 40],
        // which succeeded: it took effect before the takeover.
        let takeover = Output::Acquired(Acquired {
            fence: 2,
            session: SessionView {
                id: A,
                writer: Some(2),
                fence: 2,
                entries: 1,
                last_run: Some(2),
                last_status: Some(RunStatus::Running),
            },
            superseded: Some(1),
            created: false,
        });
        h.push(acquire(2, true), takeover, Some((20, 60)));
        h.push(append(A, 1, 1), appended(1, 1, 1, 1), Some((30, 40)));
        // Shifted after the first operation (which is at [1000, 1001]).
        for op in &mut h.ops[1..] {
            op.call += 2000;
            op.ret += 2000;
        }
        check(&h.model, &h.ops).unwrap();
        // Had the takeover answered entries: 0, the append could go in no
        // order: before it the takeover must see the entry, after it the
        // append must be refused.
        let Output::Acquired(a) = &mut h.ops[1].output else {
            panic!()
        };
        a.session.entries = 0;
        check(&h.model, &h.ops).unwrap_err();
    }

    #[test]
    fn a_write_under_an_old_epoch_is_refused_after_a_take() {
        let mut h = H::new();
        h.seq(acquire(1, false));
        let Output::Lease { granted, lease } = h.seq(Input::TakeLease {
            member: 0,
            steal: false,
        }) else {
            panic!()
        };
        assert!(granted);
        assert_eq!(lease.epoch, 1);
        // Without a token: the partition is owned now.
        let out = h.seq(append(A, 1, 1));
        assert_eq!(out, Output::Refused(Refusal::StaleOwner(Some(lease))));
        let token = Token {
            member: 0,
            epoch: 1,
        };
        let mut with_token = append(A, 1, 1);
        if let Input::Append { token: t, .. } = &mut with_token {
            *t = Some(token);
        }
        assert!(matches!(h.seq(with_token.clone()), Output::Appended { .. }));
        // Another member steals: epoch 2; member 0's token is stale.
        h.seq(Input::TakeLease {
            member: 1,
            steal: true,
        });
        let out = h.seq(with_token.clone());
        assert!(matches!(out, Output::Refused(Refusal::StaleOwner(_))));
        check(&h.model, &h.ops).unwrap();
        // The same history with that last append succeeding is rejected.
        let last = h.ops.len() - 1;
        h.ops[last].output = appended(2, 1, 1, 2);
        let failure = check(&h.model, &h.ops).unwrap_err();
        assert_eq!(failure.blocked, last);
    }

    #[test]
    fn a_reset_replaces_the_session_and_its_writer() {
        let mut h = H::new();
        h.seq(acquire(1, false));
        h.seq(append(A, 1, 1));
        let Output::Reset {
            session,
            previous,
            superseded,
        } = h.seq(Input::Reset { s: 0 })
        else {
            panic!()
        };
        assert_eq!((session.id, session.entries, session.writer), (B, 0, None));
        assert_eq!(session.fence, 1, "the fence counter stays");
        assert_eq!((previous, superseded), (Some(A), Some(1)));
        let out = h.seq(append(A, 1, 1));
        assert!(matches!(
            out,
            Output::Refused(Refusal::SessionReplaced(Some(_)))
        ));
        check(&h.model, &h.ops).unwrap();
        // A reset that kept the sessionId fits no answer.
        let mut state = h.model.init();
        h.model
            .apply(&mut state, &acquire(1, false), Some(A))
            .unwrap();
        let reset = h.model.apply(&mut state, &Input::Reset { s: 0 }, Some(A));
        assert_eq!(reset, None);
    }

    #[test]
    fn run_records_follow_start_and_finish_and_are_forgotten_after_their_last_use() {
        let mut h = H::new();
        let create = Input::CreateRun {
            s: 0,
            run: 7,
            owner: 0,
            token: None,
            uses: 3,
        };
        assert!(matches!(
            h.seq(create),
            Output::RunCreated { created: true, .. }
        ));
        let start = Input::StartRun {
            s: 0,
            run: 7,
            version: 1,
            owner: 1,
            takeover: false,
            expected_writer: None,
            count: 2,
            history: 5,
            token: None,
            uses: 3,
        };
        let Output::Started {
            record,
            acquired,
            first_seq,
            history,
        } = h.seq(start)
        else {
            panic!()
        };
        assert_eq!(
            (record.status, record.version, record.owner),
            (RunStatus::Running, 2, 1)
        );
        assert_eq!(
            (acquired.fence, acquired.session.entries, first_seq),
            (1, 2, 1)
        );
        assert!(history.is_empty(), "nothing before the user turn");
        let finish = Input::FinishRun {
            s: 0,
            run: 7,
            version: 2,
            status: RunStatus::Ok,
            writer: Some((A, 1)),
            count: 1,
            token: None,
            uses: 3,
        };
        let Output::Finished {
            record,
            first_seq,
            released,
        } = h.seq(finish)
        else {
            panic!()
        };
        assert_eq!((record.status, record.version), (RunStatus::Ok, 3));
        assert_eq!((first_seq, released), (3, true));
        assert!(h.state.runs.is_empty(), "the record is forgotten");
        let view = h.state.slots[0].view().unwrap();
        assert_eq!(view.last_status, Some(RunStatus::Ok));
        assert_eq!((view.writer, view.entries), (None, 3));
        check(&h.model, &h.ops).unwrap();
    }

    #[test]
    fn start_history_is_the_window_before_the_appended_entries() {
        assert_eq!(start_history(5, 6, 3), [2, 3, 4]);
        assert_eq!(start_history(0, 6, 2), [5, 6]);
        assert_eq!(start_history(1, 2, 3), Vec::<u64>::new());
        assert_eq!(start_history(3, 4, 0), Vec::<u64>::new());
        assert_eq!(start_history(3, 4, 9), [1, 2]);
    }
}

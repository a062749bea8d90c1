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

mod lease;
mod runs;
mod types;

use session_store::model::RunStatus;

use lease::{LeaseState, Time};
pub use types::*;

use super::Model;

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
    lease: LeaseState,
    slots: Vec<Slot>,
    /// Sorted by run.
    runs: Vec<Live>,
}

impl State {
    fn owner_check(&self, token: Option<Token>) -> Result<(), Refusal> {
        let lease = self.lease.view;
        let ok = match token {
            None => lease.epoch == 0,
            Some(t) => lease.epoch == t.epoch && lease.owner == Some(t.member),
        };
        match ok {
            true => Ok(()),
            false => Err(Refusal::StaleOwner(Some(lease))),
        }
    }

    /// Puts the sessionIds seen for placeholders.
    fn bind(&mut self, bindings: &[(Sid, Sid)]) {
        let ids = self
            .slots
            .iter_mut()
            .filter_map(|slot| slot.current.as_mut());
        let ids = ids.map(|c| &mut c.id);
        let recorded = self.runs.iter_mut().filter_map(|l| l.record.as_mut());
        for id in ids.chain(recorded.filter_map(|r| r.sid.as_mut())) {
            if let Some((_, seen)) = bindings.iter().find(|(p, _)| p == id) {
                *id = *seen;
            }
        }
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

/// One partition with `sessions` session keys, whose leases last
/// `lease_ttl_ms` (the TTL every take and renewal asks for).
pub struct Partition {
    pub sessions: usize,
    pub lease_ttl_ms: u64,
}

/// Binds the placeholders in `expected` to the sessionIds at the same
/// places in `seen`; returns the bindings, or `None` if the answers differ
/// in shape. A placeholder is unequal to every sessionId an input names:
/// a client names only sessionIds it was shown, and the answer that showed
/// it came first in real time, so it bound the placeholder already.
fn bind(expected: &mut Output, seen: &Output) -> Option<Vec<(Sid, Sid)>> {
    let mut seen = seen.clone();
    let theirs = seen.sids_mut();
    let mut ours = expected.sids_mut();
    if ours.len() != theirs.len() {
        return None;
    }
    let mut bindings: Vec<(Sid, Sid)> = Vec::new();
    for (mine, seen) in ours.iter_mut().zip(theirs) {
        if !mine.is_pending() {
            continue;
        }
        match bindings.iter().find(|(p, _)| p == &**mine) {
            Some((_, bound)) => **mine = *bound,
            None => {
                bindings.push((**mine, *seen));
                **mine = *seen;
            }
        }
    }
    Some(bindings)
}

impl Partition {
    /// Applies `input` to `state` and returns the specified answer, or
    /// `None` when no answer fits (a fresh sessionId the store reports that
    /// is not fresh). `fresh`: the sessionId of a session this operation
    /// makes, as the store reported it (a placeholder if it did not answer);
    /// `time`: when it took effect.
    fn apply(
        &self,
        state: &mut State,
        input: &Input,
        fresh: Option<Sid>,
        time: Time,
    ) -> Option<Output> {
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
            Input::TakeLease { member, steal } => Output::Lease {
                granted: state.lease.take(member, steal, time, self.lease_ttl_ms),
                lease: state.lease.view,
                now: time.shown(),
            },
            Input::RenewLease { token } => Output::Lease {
                granted: state.lease.renew(token, time, self.lease_ttl_ms),
                lease: state.lease.view,
                now: time.shown(),
            },
            Input::ReleaseLease { token } => Output::LeaseReleased(state.lease.release(token)),
            Input::ReadLease => Output::Leases(state.lease.view),
        };
        Some(out)
    }
}

impl Model for Partition {
    type State = State;
    type Input = Input;
    type Output = Output;

    fn init(&self) -> State {
        State {
            lease: LeaseState::new(),
            slots: vec![Slot::default(); self.sessions],
            runs: Vec::new(),
        }
    }

    fn step(&self, state: &State, input: &Input, output: &Output) -> Option<State> {
        if let Output::Unknown { .. } = output {
            return self.step_all(state, input, output).into_iter().next();
        }
        let mut next = state.clone();
        let mut expected = self.apply(&mut next, input, output.fresh_id(), time_of(output))?;
        if expected != *output && expected.sids_mut().iter().any(|id| id.is_pending()) {
            let bindings = bind(&mut expected, output)?;
            next.bind(&bindings);
        }
        (expected == *output).then_some(next)
    }

    /// An indeterminate operation took effect with whatever answer the
    /// rules give (which nobody saw): one state, or two for a take whose
    /// outcome hung on when it ran. (That it never took effect is the
    /// checker's to try.)
    fn step_all(&self, state: &State, input: &Input, output: &Output) -> Vec<State> {
        let &Output::Unknown { called_ms, .. } = output else {
            return self.step(state, input, output).into_iter().collect();
        };
        let undecided = match *input {
            Input::TakeLease { member, steal } => {
                state.lease.take_undecided(member, steal, called_ms)
            }
            _ => false,
        };
        let branches: &[bool] = if undecided { &[false, true] } else { &[false] };
        let took_effect = branches.iter().map(|&expired| {
            let mut next = state.clone();
            let time = Time::Unknown {
                from: called_ms,
                expired,
            };
            self.apply(&mut next, input, output.fresh_id(), time)
                .expect("an operation with a placeholder sessionId has an effect");
            next
        });
        took_effect.collect()
    }

    fn answered(&self, output: &Output) -> bool {
        !matches!(output, Output::Unknown { .. })
    }

    fn expected(&self, state: &State, input: &Input, output: &Output) -> String {
        let mut next = state.clone();
        match self.apply(&mut next, input, output.fresh_id(), time_of(output)) {
            Some(expected) => format!("{expected:?}"),
            None => "no answer fits (a sessionId that is not fresh)".to_owned(),
        }
    }
}

/// When a determinate answer says the store decided.
fn time_of(output: &Output) -> Time {
    match *output {
        Output::Lease { granted, now, .. } => Time::Known { now, granted },
        _ => Time::Known {
            now: 0,
            granted: false,
        },
    }
}

#[cfg(test)]
mod tests;

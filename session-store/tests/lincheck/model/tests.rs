use super::super::{NEVER, Operation, check};
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
        Self::with_ttl(1_000_000)
    }

    fn with_ttl(lease_ttl_ms: u64) -> Self {
        let model = Partition {
            sessions: 1,
            lease_ttl_ms,
        };
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
        // The store decides at the call, which is also the wall clock.
        let now = self.next_call();
        let out = self
            .model
            .apply(&mut self.state, &input, fresh, known(now))
            .expect("an answer");
        self.push(input, out.clone(), None);
        out
    }

    /// An operation that never answered, called next.
    fn unknown(&mut self, input: Input) {
        let call = self.next_call();
        let output = Output::Unknown {
            op: self.ops.len() as u64,
            called_ms: call,
        };
        self.push(input, output, Some((call, NEVER)));
    }

    fn next_call(&self) -> u64 {
        10 * self.ops.len() as u64 + 1000
    }

    fn push(&mut self, input: Input, output: Output, span: Option<(u64, u64)>) {
        let t = self.next_call();
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

fn known(now: u64) -> Time {
    Time::Known {
        now,
        granted: false,
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
    let Output::Lease { granted, lease, .. } = h.seq(Input::TakeLease {
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
        .apply(&mut state, &acquire(1, false), Some(A), known(0))
        .unwrap();
    let reset = h
        .model
        .apply(&mut state, &Input::Reset { s: 0 }, Some(A), known(0));
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

// ---- indeterminate operations and lease expiry ------------------------------

fn append_n(sid: Sid, run: Run, fence: u64, count: u64) -> Input {
    let Input::Append { s, token, .. } = append(sid, run, fence) else {
        unreachable!()
    };
    Input::Append {
        s,
        sid,
        run,
        fence,
        count,
        token,
    }
}

fn session(id: Sid, writer: Option<Run>, fence: u64, entries: u64) -> SessionView {
    SessionView {
        id,
        writer,
        fence,
        entries,
        last_run: Some(1),
        last_status: Some(RunStatus::Running),
    }
}

fn read(h: &mut H, view: Option<SessionView>) {
    h.push(Input::Read { s: 0 }, Output::Read(view), None);
}

#[test]
fn an_indeterminate_append_cannot_explain_more_than_it_wrote() {
    let mut h = H::new();
    h.seq(acquire(1, false));
    h.unknown(append_n(A, 1, 1, 1));
    // Two entries: more than the unanswered append could have added.
    read(&mut h, Some(session(A, Some(1), 1, 2)));
    let failure = check(&h.model, &h.ops).unwrap_err();
    assert_eq!(failure.blocked, 2, "the read");
    // One entry: it took effect before the read.
    h.ops[2].output = Output::Read(Some(session(A, Some(1), 1, 1)));
    check(&h.model, &h.ops).unwrap();
    // Once seen, it stays: a later read of none is not linearizable.
    read(&mut h, Some(session(A, Some(1), 1, 0)));
    check(&h.model, &h.ops).unwrap_err();
}

#[test]
fn an_indeterminate_append_may_never_have_happened() {
    let mut h = H::new();
    h.seq(acquire(1, false));
    h.unknown(append_n(A, 1, 1, 2));
    // The holder's next append lands at seq 1 and a read shows one entry:
    // linearizable only with the unanswered append never taking effect.
    assert_eq!(h.seq(append(A, 1, 1)), appended(1, 1, 1, 1));
    h.seq(Input::Read { s: 0 });
    check(&h.model, &h.ops).unwrap();
    // Landing at seq 3 instead says it did, before.
    h.ops[2].output = appended(3, 1, 1, 3);
    h.ops[3].output = Output::Read(Some(session(A, Some(1), 1, 3)));
    check(&h.model, &h.ops).unwrap();
}

#[test]
fn the_session_an_indeterminate_reset_made_is_bound_when_first_seen() {
    let mut h = H::new();
    h.seq(acquire(1, false));
    h.unknown(Input::Reset { s: 0 });
    // A session nobody was told of: the reset's, which took effect.
    let fresh = SessionView {
        id: B,
        writer: None,
        fence: 1,
        entries: 0,
        last_run: None,
        last_status: None,
    };
    read(&mut h, Some(fresh.clone()));
    // The old holder is refused: its session was replaced by that one.
    let refused = Output::Refused(Refusal::SessionReplaced(Some(fresh.clone())));
    h.push(append(A, 1, 1), refused, None);
    check(&h.model, &h.ops).unwrap();
    // A later read showing yet another sessionId fits no order: the
    // placeholder is B now.
    let other = SessionView {
        id: Sid(0xc << 96),
        ..fresh
    };
    read(&mut h, Some(other));
    let failure = check(&h.model, &h.ops).unwrap_err();
    assert_eq!(failure.blocked, 4);
}

fn take(member: Member) -> Input {
    Input::TakeLease {
        member,
        steal: false,
    }
}

fn lease(owner: Member, epoch: u64) -> LeaseView {
    LeaseView {
        owner: Some(owner),
        epoch,
    }
}

#[test]
fn a_lease_another_member_holds_is_taken_only_once_expired() {
    let mut h = H::with_ttl(100);
    // Member 0 takes it at 1000: it expires at 1100.
    h.seq(take(0));
    let refused = Output::Lease {
        granted: false,
        lease: lease(0, 1),
        now: 1099,
    };
    h.push(take(1), refused, Some((1099, 1100)));
    let granted = Output::Lease {
        granted: true,
        lease: lease(1, 2),
        now: 1100,
    };
    h.push(take(1), granted, Some((1100, 1101)));
    check(&h.model, &h.ops).unwrap();
    // A grant before the expiry is not linearizable, nor a refusal after.
    let Output::Lease { now, .. } = &mut h.ops[2].output else {
        unreachable!()
    };
    *now = 1099;
    check(&h.model, &h.ops).unwrap_err();
    let Output::Lease { now, .. } = &mut h.ops[1].output else {
        unreachable!()
    };
    *now = 1100;
    check(&h.model, &h.ops).unwrap_err();
}

#[test]
fn an_indeterminate_take_may_have_won_or_lost_the_lease() {
    let mut h = H::with_ttl(100);
    h.seq(take(0));
    // Member 1's take (not stealing) never answered: before member 0's
    // expiry it lost, after it won; it may have run at either time.
    h.unknown(take(1));
    let list = |h: &mut H, view: LeaseView, at: u64| {
        h.push(Input::ReadLease, Output::Leases(view), Some((at, at + 1)));
    };
    list(&mut h, lease(1, 2), 1200);
    check(&h.model, &h.ops).unwrap();
    h.ops[2].output = Output::Leases(lease(0, 1));
    check(&h.model, &h.ops).unwrap();
    // But not both: once it has won, member 0 is not back.
    list(&mut h, lease(1, 2), 1300);
    list(&mut h, lease(0, 1), 1400);
    check(&h.model, &h.ops).unwrap_err();
    // An unanswered renewal may have extended the tenure, to its call +
    // TTL at the earliest: a refusal past the first expiry fits then.
    let mut h = H::with_ttl(100);
    h.seq(take(0));
    let renew = Input::RenewLease {
        token: Token {
            member: 0,
            epoch: 1,
        },
    };
    h.unknown(renew);
    let refused = Output::Lease {
        granted: false,
        lease: lease(0, 1),
        now: 1105,
    };
    h.push(take(1), refused, Some((1105, 1106)));
    check(&h.model, &h.ops).unwrap();
    // Without it, the tenure had expired at 1100.
    h.ops.remove(1);
    check(&h.model, &h.ops).unwrap_err();
}

#[test]
fn an_indeterminate_write_to_a_killed_store_took_effect_before_the_kill_or_never() {
    let mut h = H::new();
    h.seq(acquire(1, false));
    // Its store was gone by time 1015: a read after that shows no entry.
    let call = h.next_call();
    let output = Output::Unknown {
        op: 1,
        called_ms: call,
    };
    h.push(append_n(A, 1, 1, 1), output, Some((call, call + 5)));
    read(&mut h, Some(session(A, Some(1), 1, 0)));
    check(&h.model, &h.ops).unwrap();
    // A later read showing its entry is not linearizable: it cannot have
    // taken effect after its store was gone (unbounded, it could have).
    read(&mut h, Some(session(A, Some(1), 1, 1)));
    let failure = check(&h.model, &h.ops).unwrap_err();
    assert_eq!(failure.blocked, 3);
    h.ops[1].ret = NEVER;
    check(&h.model, &h.ops).unwrap();
}

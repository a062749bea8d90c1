use super::*;

/// A read/write register of small integers.
struct Register;

#[derive(Debug, Clone, Copy)]
enum RegIn {
    Write(u32),
    Read,
}

impl Model for Register {
    type State = u32;
    type Input = RegIn;
    type Output = u32;

    fn init(&self) -> u32 {
        0
    }

    fn step(&self, state: &u32, input: &RegIn, output: &u32) -> Option<u32> {
        match input {
            RegIn::Write(v) => Some(*v),
            RegIn::Read => (output == state).then_some(*state),
        }
    }

    fn answered(&self, output: &u32) -> bool {
        *output != UNANSWERED
    }

    fn expected(&self, state: &u32, input: &RegIn, _: &u32) -> String {
        match input {
            RegIn::Write(_) => "ok".into(),
            RegIn::Read => state.to_string(),
        }
    }
}

/// The output of a call that never answered.
const UNANSWERED: u32 = u32::MAX;

fn op(client: usize, input: RegIn, output: u32, call: u64, ret: u64) -> Operation<RegIn, u32> {
    Operation {
        client,
        input,
        call,
        output,
        ret,
    }
}

#[test]
fn an_empty_history_is_linearizable() {
    assert_eq!(check(&Register, &[]).unwrap().ops, 0);
}

#[test]
fn a_sequential_history_that_follows_the_model_is_accepted() {
    let history = [
        op(0, RegIn::Write(1), 0, 0, 1),
        op(1, RegIn::Read, 1, 2, 3),
        op(0, RegIn::Write(2), 0, 4, 5),
        op(1, RegIn::Read, 2, 6, 7),
    ];
    check(&Register, &history).unwrap();
}

#[test]
fn a_read_of_an_overwritten_value_after_the_write_completed_is_rejected() {
    let history = [op(0, RegIn::Write(1), 0, 0, 1), op(1, RegIn::Read, 0, 2, 3)];
    let failure = check(&Register, &history).unwrap_err();
    assert_eq!(failure.linearized, 1, "the write, and nothing after it");
    assert_eq!(failure.blocked, 1, "the stale read");
    assert_eq!(failure.candidates, [1]);
    assert_eq!(failure.state, 1);
    let text = explain(&Register, &history, &failure);
    assert!(text.contains("at most 1 of 2"), "{text}");
    assert!(text.contains("model:   1"), "{text}");
}

#[test]
fn overlapping_operations_may_take_effect_in_any_order_that_fits() {
    // The write overlaps both reads: the first read sees the old
    // value, the second the new one. Linearizable: read, write, read.
    let history = [
        op(0, RegIn::Write(1), 0, 0, 10),
        op(1, RegIn::Read, 0, 1, 2),
        op(2, RegIn::Read, 1, 3, 4),
    ];
    check(&Register, &history).unwrap();
    // Even listed out of order, and with the write taking effect only
    // after a read that started later.
    let history = [
        op(2, RegIn::Read, 1, 3, 4),
        op(0, RegIn::Write(1), 0, 0, 10),
        op(1, RegIn::Read, 0, 1, 9),
    ];
    check(&Register, &history).unwrap();
}

#[test]
fn a_new_value_then_the_old_one_is_rejected_even_when_overlapping_the_write() {
    // The first read (complete before the second began) saw the new
    // value, the second the old one: no order fits.
    let history = [
        op(0, RegIn::Write(1), 0, 0, 10),
        op(1, RegIn::Read, 1, 1, 2),
        op(2, RegIn::Read, 0, 3, 4),
    ];
    let failure = check(&Register, &history).unwrap_err();
    assert_eq!(failure.blocked, 2, "the read of the old value");
    assert!(failure.linearized >= 1);
}

#[test]
fn memoization_makes_wide_histories_cheap() {
    // 8 clients each write the same value 300 times; the 8 writes of a
    // round overlap. A last read of a value nobody wrote makes the
    // history fail, which forces the whole space to be searched: 8!
    // orders per round, nested over 300 rounds, without the cache; with
    // it, each subset of a round once (300 * 2^8 configurations).
    let mut history = Vec::new();
    for round in 0..300u64 {
        for client in 0..8u64 {
            let call = round * 100 + client;
            history.push(op(client as usize, RegIn::Write(7), 0, call, call + 50));
        }
    }
    let stats = check(&Register, &history).unwrap();
    assert_eq!(stats.ops, 2400);
    history.push(op(99, RegIn::Read, 8, 40_000, 40_001));
    let failure = check(&Register, &history).unwrap_err();
    assert_eq!(failure.blocked, 2400);
    assert_eq!(failure.linearized, 2400);
    assert!(
        failure.stats.cached <= 300 * 256 + 1,
        "configurations explored: {}",
        failure.stats.cached
    );
}

#[test]
fn the_search_backtracks_out_of_a_wrong_early_choice() {
    // Both writes overlap; the reads after them force write 2 to go
    // first, then write 1, although write 1 was called first.
    let history = [
        op(0, RegIn::Write(1), 0, 0, 10),
        op(1, RegIn::Write(2), 0, 1, 11),
        op(2, RegIn::Read, 2, 2, 3),
        op(2, RegIn::Read, 1, 12, 13),
    ];
    let stats = check(&Register, &history).unwrap();
    assert!(stats.backtracks >= 1, "{stats:?}");
}

#[test]
fn an_unanswered_write_takes_effect_once_if_at_all() {
    let write = op(0, RegIn::Write(1), UNANSWERED, 0, NEVER);
    // Never seen, or seen from some point on: both fit.
    let mut history = vec![write.clone(), op(1, RegIn::Read, 0, 1, 2)];
    check(&Register, &history).unwrap();
    history.push(op(1, RegIn::Read, 1, 3, 4));
    history.push(op(1, RegIn::Read, 1, 5, 6));
    check(&Register, &history).unwrap();
    // Seen, then unseen: it cannot have happened twice, nor undone.
    history.push(op(1, RegIn::Read, 0, 7, 8));
    let failure = check(&Register, &history).unwrap_err();
    assert_eq!(failure.blocked, 4);
}

#[test]
fn an_unanswered_write_is_bounded_by_its_return_time() {
    // Its return time is when it can no longer take effect (its server
    // was gone): a read after that sees it or not, and so does every
    // later read.
    let write = op(0, RegIn::Write(1), UNANSWERED, 0, 5);
    for seen in [0, 1] {
        let history = [
            write.clone(),
            op(1, RegIn::Read, seen, 10, 11),
            op(1, RegIn::Read, seen, 12, 13),
        ];
        check(&Register, &history).unwrap();
    }
    let history = [
        write.clone(),
        op(1, RegIn::Read, 0, 10, 11),
        op(1, RegIn::Read, 1, 12, 13),
    ];
    let failure = check(&Register, &history).unwrap_err();
    assert_eq!(failure.blocked, 2, "the write cannot land after its bound");
    // Unbounded, it can.
    let mut history = history;
    history[0].ret = NEVER;
    check(&Register, &history).unwrap();
}

#[test]
fn unanswered_writes_are_placed_only_where_an_answer_needs_them() {
    // 40 unanswered writes of 7, none of which took effect (every read
    // sees 0). Tried first, each would be placed at its call and undone
    // at the next read; tried last, none is placed before the end and
    // nothing is undone: one configuration per operation.
    let mut history = Vec::new();
    for i in 0..40u64 {
        history.push(op(i as usize, RegIn::Write(7), UNANSWERED, 10 * i, NEVER));
        history.push(op(99, RegIn::Read, 0, 10 * i + 1, 10 * i + 2));
    }
    let stats = check(&Register, &history).unwrap();
    assert_eq!((stats.backtracks, stats.cached), (0, 80), "{stats:?}");
}

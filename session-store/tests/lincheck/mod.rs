//! A linearizability checker: Wing & Gong's search with Lowe's memoization,
//! as Porcupine does it.
//!
//! A history is a set of operations, each with the input it was called with,
//! the output it answered, and the (logical) times of its call and its
//! answer. It is linearizable when the operations can be put in one order
//! that respects real time (an operation answered before another was called
//! comes first) and in which every answer is the one the sequential
//! specification ([`Model`]) gives.
//!
//! The search walks a doubly linked list of call and return events in time
//! order. At a call it tries to linearize that operation next (the model
//! must accept its answer from the current state); if so it lifts the
//! operation out of the list and starts again from the front. At a return
//! it has met an operation that must come before everything not yet
//! placed, but could not be placed: it backtracks, undoing the last choice.
//! Lowe's memoization makes it practical: a configuration (the set of
//! operations linearized, the model state) seen once is never explored
//! again, whatever order got there. The set is a bitset over the operations
//! in call order; the cache keys it by its lowest unplaced operation and the
//! words from there to its highest placed one, which is a few words however
//! long the history, since only operations overlapping the first unplaced
//! one can be placed past it.

use std::collections::HashSet;
use std::fmt::{Debug, Write as _};
use std::hash::Hash;

pub mod history;
pub mod model;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    type Input: Debug;
    type Output: Debug;

    fn init(&self) -> Self::State;

    /// The state after `input` was applied and answered `output`, if the
    /// specification allows that answer from `state`.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;

    /// Every state the operation may leave with this answer, tried in
    /// order: the one `step` gives, or several where the answer leaves the
    /// effect open (an indeterminate operation whose effect hung on
    /// something nobody saw, such as when it ran).
    fn step_all(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Vec<Self::State> {
        self.step(state, input, output).into_iter().collect()
    }

    /// Whether the output is an answer. A call that never answered may
    /// have had any effect `step_all` gives, or none.
    fn answered(&self, _output: &Self::Output) -> bool {
        true
    }

    /// What the specification would answer (for reports). `output` is the
    /// answer seen, for models whose answer picks among fresh values.
    fn expected(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> String;
}

/// One operation of a history. `call < ret`; times are comparable across
/// clients (a global counter, or instants). An operation without an answer
/// (a timeout, a lost connection; see [`Model::answered`]) has as `ret` the
/// latest time it can have taken effect, or [`NEVER`]; it may also never
/// have taken effect.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    pub client: usize,
    pub input: I,
    pub call: u64,
    pub output: O,
    pub ret: u64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub ops: usize,
    /// Model steps tried.
    pub steps: u64,
    /// Choices undone.
    pub backtracks: u64,
    /// Configurations in the memo cache.
    pub cached: usize,
}

/// Where the search got furthest, for a history that is not linearizable.
#[derive(Debug, Clone)]
pub struct Failure<S> {
    /// The longest linearizable prefix found: this many operations placed.
    pub linearized: usize,
    pub total: usize,
    /// The operation that could not be placed there (an index into the
    /// history as given): every operation not placed yet was called before
    /// it answered, and none of them could go next.
    pub blocked: usize,
    /// The last operations of that prefix, in linearization order.
    pub tail: Vec<usize>,
    /// The operations that could have gone next (called before `blocked`
    /// answered, not placed), `blocked` among them.
    pub candidates: Vec<usize>,
    /// The model state after the prefix.
    pub state: S,
    pub stats: Stats,
}

/// The return time of an operation that never answered.
pub const NEVER: u64 = u64::MAX;

const NIL: usize = usize::MAX;
/// The branch of an unanswered operation placed as never having taken
/// effect.
const DROPPED: usize = usize::MAX;
/// The most configurations a search may remember (up to a few kilobytes
/// each, with a long unanswered stretch in the key and many live runs):
/// past it, it stops with a panic rather than take the machine's memory.
/// Histories of 10,000 operations per partition need tens of thousands.
pub const MAX_CONFIGURATIONS: usize = 1_000_000;
/// How many operations of the longest prefix a failure shows.
const TAIL: usize = 24;

/// The set of operations placed, by rank in call order.
struct Placed {
    words: Vec<u64>,
    /// The lowest rank not placed.
    low: usize,
    /// The highest rank placed, if any.
    high: Option<usize>,
}

impl Placed {
    fn contains(&self, rank: usize) -> bool {
        self.words[rank / 64] & (1 << (rank % 64)) != 0
    }

    fn insert(&mut self, rank: usize) {
        self.words[rank / 64] |= 1 << (rank % 64);
        self.high = Some(self.high.map_or(rank, |h| h.max(rank)));
        while self.low < self.words.len() * 64 && self.contains(self.low) {
            self.low += 1;
        }
    }

    /// Takes `rank` out again, restoring the bounds saved before it went in.
    fn remove(&mut self, rank: usize, low: usize, high: Option<usize>) {
        self.words[rank / 64] &= !(1 << (rank % 64));
        self.low = low;
        self.high = high;
    }

    /// A canonical, compact key: every rank below `low` is placed, and the
    /// words from `low` to `high` say which others are.
    fn key(&self) -> (u32, Box<[u64]>) {
        let words = match self.high {
            Some(high) if high >= self.low => &self.words[self.low / 64..=high / 64],
            _ => &[][..],
        };
        (self.low as u32, words.into())
    }
}

/// A choice on the search stack: the call entry lifted, which of the
/// states its step allows was taken, in which pass, the state before it,
/// the bounds of `Placed` before it.
struct Frame<S> {
    entry: usize,
    branch: usize,
    /// Whether it was tried among the operations that never answered.
    lazy: bool,
    state: S,
    low: usize,
    high: Option<usize>,
}

/// Checks `history` against `model`. `Ok` with statistics when it is
/// linearizable, else where the search got furthest.
pub fn check<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
) -> Result<Stats, Box<Failure<M::State>>> {
    let n = history.len();
    for op in history {
        assert!(op.call < op.ret, "an operation answers after its call");
    }
    // Ranks in call order; entry 2r is the call of rank r, 2r+1 its return.
    let mut by_call: Vec<usize> = (0..n).collect();
    by_call.sort_by_key(|&i| (history[i].call, i));
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (rank, &i) in by_call.iter().enumerate() {
        events.push((history[i].call, 0, 2 * rank));
        events.push((history[i].ret, 1, 2 * rank + 1));
    }
    // At equal times calls come first: the operations overlap.
    events.sort_unstable();
    let head = 2 * n;
    let mut next = vec![NIL; 2 * n + 1];
    let mut prev = vec![NIL; 2 * n + 1];
    let mut last = head;
    for &(_, _, entry) in &events {
        next[last] = entry;
        prev[entry] = last;
        last = entry;
    }

    let lift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        let ret = call + 1;
        next[prev[call]] = next[call];
        prev[next[call]] = prev[call];
        next[prev[ret]] = next[ret];
        if next[ret] != NIL {
            prev[next[ret]] = prev[ret];
        }
    };
    let unlift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        let ret = call + 1;
        next[prev[ret]] = ret;
        if next[ret] != NIL {
            prev[next[ret]] = ret;
        }
        next[prev[call]] = call;
        prev[next[call]] = call;
    };

    let mut stats = Stats {
        ops: n,
        ..Stats::default()
    };
    let mut placed = Placed {
        words: vec![0; n.div_ceil(64).max(1)],
        low: 0,
        high: None,
    };
    let mut cache: HashSet<(u32, Box<[u64]>, M::State)> = HashSet::new();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut state = model.init();
    let mut best: Option<Box<Failure<M::State>>> = None;
    // Operations that never answered are tried last (`lazy`): only once no
    // operation that answered can go next. Tried first, each would be
    // placed at its call, and one that never took effect (or took effect
    // late) would then be found out only where something contradicts it,
    // perhaps far on, after a search of everything in between, and again at
    // every later place it is tried. Tried last, it is placed where an
    // answer needs it. The candidates are the same either way.
    let unanswered: Vec<bool> = (by_call.iter())
        .map(|&i| !model.answered(&history[i].output))
        .collect();
    let mut lazy = false;
    let mut entry = next[head];
    // The first of an entry's states to try: past 0 when the search comes
    // back to an entry whose earlier states led nowhere.
    let mut first_branch = 0;
    while next[head] != NIL {
        assert!(
            cache.len() <= MAX_CONFIGURATIONS,
            "the search gave up after {MAX_CONFIGURATIONS} configurations ({stats:?}), \
             neither finding a linearization nor ruling one out"
        );
        let is_call = entry.is_multiple_of(2);
        if is_call && unanswered[entry / 2] != lazy {
            entry = next[entry];
            continue;
        }
        if !is_call && !lazy {
            // Nothing that answered can go next: now those that did not.
            lazy = true;
            entry = next[head];
            continue;
        }
        if !is_call && unanswered[entry / 2] && first_branch != DROPPED {
            // An unanswered operation that must be placed by now, none of
            // its effects fitting: as never having taken effect. (Placed so
            // anywhere earlier, it would leave the state as it was: trying
            // that only here loses nothing.)
            let (call, rank) = (entry - 1, entry / 2);
            stats.steps += 1;
            let (low, high) = (placed.low, placed.high);
            placed.insert(rank);
            let (key_low, key_words) = placed.key();
            if cache.insert((key_low, key_words, state.clone())) {
                stack.push(Frame {
                    entry: call,
                    branch: DROPPED,
                    lazy,
                    state: state.clone(),
                    low,
                    high,
                });
                lift(&mut next, &mut prev, call);
                (entry, lazy) = (next[head], false);
                continue;
            }
            placed.remove(rank, low, high);
        }
        if is_call {
            let rank = entry / 2;
            let op = &history[by_call[rank]];
            stats.steps += 1;
            let mut branches = model.step_all(&state, &op.input, &op.output);
            if unanswered[rank] {
                // An effect that changes nothing is no effect, which is
                // tried where the operation must be placed (above).
                branches.retain(|after| *after != state);
            }
            let mut lifted = false;
            for (branch, after) in branches.into_iter().enumerate().skip(first_branch) {
                let (low, high) = (placed.low, placed.high);
                placed.insert(rank);
                let (key_low, key_words) = placed.key();
                if cache.insert((key_low, key_words, after.clone())) {
                    stack.push(Frame {
                        entry,
                        branch,
                        lazy,
                        state: std::mem::replace(&mut state, after),
                        low,
                        high,
                    });
                    lift(&mut next, &mut prev, entry);
                    lifted = true;
                    break;
                }
                placed.remove(rank, low, high);
            }
            first_branch = 0;
            entry = match lifted {
                true => {
                    lazy = false;
                    next[head]
                }
                false => next[entry],
            };
        } else {
            // The operation answering here cannot be placed next.
            if best.as_ref().is_none_or(|b| stack.len() > b.linearized) {
                let mut candidates = Vec::new();
                let mut at = next[head];
                while at != entry {
                    if at.is_multiple_of(2) {
                        candidates.push(by_call[at / 2]);
                    }
                    at = next[at];
                }
                best = Some(Box::new(Failure {
                    linearized: stack.len(),
                    total: n,
                    blocked: by_call[entry / 2],
                    tail: stack[stack.len().saturating_sub(TAIL)..]
                        .iter()
                        .map(|f| by_call[f.entry / 2])
                        .collect(),
                    candidates,
                    state: state.clone(),
                    stats,
                }));
            }
            let Some(frame) = stack.pop() else {
                let mut failure = best.expect("a failure was recorded");
                failure.stats = Stats {
                    cached: cache.len(),
                    ..stats
                };
                return Err(failure);
            };
            stats.backtracks += 1;
            placed.remove(frame.entry / 2, frame.low, frame.high);
            state = frame.state;
            unlift(&mut next, &mut prev, frame.entry);
            lazy = frame.lazy;
            (entry, first_branch) = match frame.branch {
                // Back at its return, with nothing left to try there.
                DROPPED => (frame.entry + 1, DROPPED),
                // The same entry again, with its next state if it has one.
                branch => (frame.entry, branch + 1),
            };
        }
    }
    stats.cached = cache.len();
    Ok(stats)
}

/// A readable account of a failure: the operations around the point where
/// the search got stuck, what each answered and what the model expected.
pub fn explain<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    failure: &Failure<M::State>,
) -> String {
    let mut out = String::new();
    let show = |out: &mut String, i: usize| {
        let op = &history[i];
        let _ = writeln!(
            out,
            "  #{i} client {} [{}, {}] {:?}\n      answered {:?}",
            op.client, op.call, op.ret, op.input, op.output
        );
    };
    let _ = writeln!(
        out,
        "not linearizable: at most {} of {} operations linearized ({} steps, {} backtracks, {} configurations)",
        failure.linearized,
        failure.total,
        failure.stats.steps,
        failure.stats.backtracks,
        failure.stats.cached
    );
    let _ = writeln!(out, "the end of the longest linearizable prefix:");
    for &i in &failure.tail {
        show(&mut out, i);
    }
    let _ = writeln!(out, "the model state after it:\n  {:?}", failure.state);
    let _ = writeln!(
        out,
        "the operation that could not be placed (it answered before any candidate below could go next):"
    );
    show(&mut out, failure.blocked);
    let _ = writeln!(
        out,
        "candidates to go next, and what the model answers to each:"
    );
    for &i in &failure.candidates {
        show(&mut out, i);
        let op = &history[i];
        let expected = model.expected(&failure.state, &op.input, &op.output);
        let _ = writeln!(out, "      model:   {expected}");
    }
    out
}

#[cfg(test)]
mod tests;

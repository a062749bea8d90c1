//! The fan-in: one `Subscribe(all)` event stream per coordinator that owns
//! partitions, all feeding the same translation and delivery (`fanout.rs`).
//!
//! Which streams: the distinct live owner addresses of the partition map
//! (`Routes::stream_addresses`), or the one coordinator followed while the
//! partitions are not split over several. A stream is opened for each new
//! address and closed when its address owns nothing any more. Each keeps its
//! own position (epoch + `stream_seq`) and reconnects with backoff, resuming
//! from it; a reset (the coordinator restarted, or this edge fell behind)
//! makes it follow live again.
//!
//! Runs whose end may have happened out of sight are looked up (a routed
//! `Get`, on the coordinator owning them now) until each is terminal: after
//! a stream's reset, the runs it had shown start and not end, and the runs
//! this edge awaits in that coordinator's partitions; the awaited ones again
//! once a stream that starts live is open (they may have started before);
//! when a partition moves (a new owner, a new epoch) or a stream is closed,
//! the same for those partitions. The new owner of a dead coordinator's partitions
//! settles the runs that were executing there as `lost` (after about the
//! lease TTL), so a lookup is retried every half second until twice the
//! failover timeout. A terminal snapshot reaches clients as the run's
//! terminal events (`RunMemory::settle`); a lookup that finds the run still
//! going on a coordinator whose stream was open before the lookup and still
//! is leaves the end to that stream.
//!
//! `edge.fanout_ready` (`/readyz`) is true while any wanted stream is open.
//! Each event is translated (`translate.rs`), delivered (`fanout.rs`) and
//! handed to the session feed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use run_coordinator_api::Routes;
use run_coordinator_api::events::{RunEvent, StreamItem};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Events;
use super::fanout;
use super::translate::{Pending, RunMemory, is_terminal};
use crate::state::Edge;

/// How soon a lookup that found its run not terminal is tried again.
const LOOKUP_RETRY: Duration = Duration::from_millis(500);
/// Lookups in flight at once.
const LOOKUP_CONCURRENCY: usize = 16;
/// How often the wanted streams are worked out again without a change of
/// the routes (a lease that lapsed is no change the router announces
/// until the next lease table).
const RECHECK: Duration = Duration::from_secs(1);

/// Most runs [`FanIn::await_run`] remembers; past it the oldest half is
/// not looked up after a failover (clients can still `agent.wait` them).
pub const MAX_AWAITED_RUNS: usize = 100_000;

/// The fan-in's shared state (in [`Events`]).
#[derive(Default)]
pub struct FanIn {
    /// The translation memory of every stream, and the runs to look up.
    pub memory: std::sync::Mutex<RunMemory>,
    streams: std::sync::Mutex<StreamBook>,
    /// Segments are numbered across all streams (`ConnRuns::note_broadcast`).
    next_segment: AtomicU64,
    next_stream: AtomicU64,
    /// Wakes the lookups.
    lookups: tokio::sync::Notify,
    /// Runs this edge accepted and has not seen end: after a coordinator
    /// failover each is looked up, so that a run whose end happened out of
    /// its sight still reaches clients.
    awaited: std::sync::Mutex<HashSet<String>>,
    /// Stream openings that failed in a row, every stream task counted:
    /// a failover starts a new task on another address, so a pause kept
    /// per task would start over at each switch, and coordinators that
    /// all refuse would be tried in a tight loop.
    failures: std::sync::atomic::AtomicU32,
}

/// The pause after the first failed stream opening; it doubles with each
/// failure in a row up to [`LONGEST_FAILURE_PAUSE`].
const FIRST_FAILURE_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_FAILURE_PAUSE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct StreamBook {
    /// The addresses streams are wanted from.
    wanted: Vec<String>,
    /// Per address: the stream task's id, and while its stream is open the
    /// number of its opening (a reopened stream has a new one).
    open: HashMap<String, (u64, Option<u64>)>,
    openings: u64,
}

impl FanIn {
    /// Remembers a run until its end is seen. Called before its Submit: a
    /// coordinator event stream that opens while the Submit is on its way
    /// looks up the awaited runs of its partitions, so a run that starts
    /// before that stream is open cannot end unseen.
    pub fn await_run(&self, run_id: &str) {
        let mut awaited = self.awaited.lock().unwrap();
        if awaited.len() >= MAX_AWAITED_RUNS {
            awaited.clear();
        }
        awaited.insert(run_id.to_owned());
    }

    /// Forgets an awaited run (its Submit failed, or it had ended).
    pub fn unawait_run(&self, run_id: &str) {
        self.awaited.lock().unwrap().remove(run_id);
    }

    /// After a failed stream opening: how long to wait before the next
    /// attempt, here or on the address the router moves to.
    fn failure_pause(&self) -> Duration {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed).min(16);
        FIRST_FAILURE_PAUSE
            .saturating_mul(1 << failures)
            .min(LONGEST_FAILURE_PAUSE)
    }

    fn next_segment(&self) -> u64 {
        self.next_segment.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The open streams: address → opening.
    fn open_streams(&self) -> HashMap<String, u64> {
        let book = self.streams.lock().unwrap();
        book.open
            .iter()
            .filter_map(|(address, (_, open))| open.map(|n| (address.clone(), n)))
            .collect()
    }

    fn mark(&self, edge: &Edge, address: &str, stream: u64, open: bool) {
        let mut book = self.streams.lock().unwrap();
        book.openings += 1;
        let opening = open.then_some(book.openings);
        match book.open.get_mut(address) {
            Some(state) if state.0 == stream => state.1 = opening,
            // The word of a stream already replaced or closed.
            _ => return,
        }
        ready(edge, &book);
    }

    fn set_wanted(&self, edge: &Edge, wanted: Vec<String>) {
        let mut book = self.streams.lock().unwrap();
        book.open.retain(|address, _| wanted.contains(address));
        book.wanted = wanted;
        ready(edge, &book);
    }

    fn register(&self, address: &str, stream: u64) {
        let mut book = self.streams.lock().unwrap();
        book.open.insert(address.to_owned(), (stream, None));
    }
}

/// Ready while at least one wanted stream is open: with the partitions
/// spread, a coordinator going away must not take every edge out of its
/// Service until its partitions have moved (the others' sessions are
/// served meanwhile, and the moved runs' ends are looked up).
fn ready(edge: &Edge, book: &StreamBook) {
    edge.fanout_ready.store(book.any_open(), Ordering::Relaxed);
}

impl StreamBook {
    fn any_open(&self) -> bool {
        self.wanted
            .iter()
            .any(|a| self.open.get(a).is_some_and(|(_, open)| open.is_some()))
    }
}

/// A running stream task.
struct StreamTask {
    id: u64,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The stream tasks by address; dropping it (the fan-in's end) ends them.
#[derive(Default)]
struct StreamTasks(HashMap<String, StreamTask>);

impl Drop for StreamTasks {
    fn drop(&mut self) {
        for task in self.0.values() {
            task.task.abort();
        }
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Follows the coordinators' event streams until dropped.
pub async fn run(edge: Arc<Edge>, events: Arc<Events>) {
    let router = edge.backends.coordinator.clone();
    let mut watch = router.watch_routes();
    let mut tasks = StreamTasks::default();
    let _lookups = AbortOnDrop(tokio::spawn(look_up_runs(edge.clone(), events.clone())));
    let mut known: Routes = watch.borrow_and_update().clone();
    loop {
        let routes = watch.borrow_and_update().clone();
        // Partitions that moved: what this edge knew of their runs may be
        // out of date.
        if known.map.is_known() {
            let moved: HashSet<u32> = known
                .map
                .changed_partitions(&routes.map)
                .into_iter()
                .collect();
            if !moved.is_empty() {
                tracing::info!(
                    partitions = moved.len(),
                    "coordinator partitions moved; looking up their runs"
                );
                look_up(&edge, &events, |_, partition| {
                    partition.is_none_or(|p| moved.contains(&p))
                });
            }
        }
        let wanted = routes.stream_addresses(Instant::now());
        let retired: Vec<String> = tasks
            .0
            .keys()
            .filter(|a| !wanted.contains(a))
            .cloned()
            .collect();
        for address in retired {
            let task = tasks.0.remove(&address).expect("listed above");
            task.stop.cancel();
            let _ = task.task.await;
            clawgate_telemetry::limited!(info, %address, "closed the event stream of a coordinator that owns no partition now");
            // Its runs, and the awaited ones of the partitions it had.
            look_up_stream(&edge, &events, &known, &address, task.id);
        }
        for address in &wanted {
            if !tasks.0.contains_key(address) {
                let id = events.fanin.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
                events.fanin.register(address, id);
                let stop = CancellationToken::new();
                let task = tokio::spawn(follow(
                    edge.clone(),
                    events.clone(),
                    address.clone(),
                    id,
                    stop.clone(),
                ));
                tasks
                    .0
                    .insert(address.clone(), StreamTask { id, stop, task });
            }
        }
        events.fanin.set_wanted(&edge, wanted);
        known = routes;
        tokio::select! {
            changed = watch.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// Follows one coordinator's all-runs stream until `stop`.
async fn follow(
    edge: Arc<Edge>,
    events: Arc<Events>,
    address: String,
    id: u64,
    stop: CancellationToken,
) {
    let router = edge.backends.coordinator.clone();
    // Live only at first: clients replay older events with `runs.resume`.
    let mut position: Option<(String, u64)> = None;
    // A new segment each time the stream starts live (a gap may precede it).
    let mut segment = 0;
    loop {
        // Live: whatever happened before it opens is out of sight.
        let live = position.is_none();
        if live {
            segment = events.fanin.next_segment();
        }
        let after = position.as_ref().map(|(epoch, seq)| (epoch.as_str(), *seq));
        let mut hint = None;
        // A reset is an answer, not a failure: resubscribe live at once, to
        // the same coordinator.
        let mut was_reset = false;
        let opened = tokio::select! {
            opened = router.subscribe_all_at(&address, after) => opened,
            () = stop.cancelled() => return,
        };
        match opened {
            Ok(mut stream) => {
                loop {
                    let item = tokio::select! {
                        item = stream.next() => item,
                        () = stop.cancelled() => return,
                    };
                    match item {
                        Ok(Some(StreamItem::Event(event))) => {
                            position = Some((event.epoch.to_string(), event.stream_seq));
                            on_event(&edge, &events, id, segment, &event);
                        }
                        Ok(Some(StreamItem::Subscribed { .. })) => {
                            events.fanin.failures.store(0, Ordering::Relaxed);
                            events.fanin.mark(&edge, &address, id, true);
                            if live {
                                // Runs awaited here may have started (and
                                // ended) before this stream was open.
                                look_up_stream(&edge, &events, &router.routes(), &address, id);
                            }
                        }
                        Ok(Some(StreamItem::Reset(reset))) => {
                            tracing::warn!(%address, reason = %reset.reason, epoch = %reset.epoch, "coordinator event stream reset; following live");
                            position = None;
                            events.fanin.mark(&edge, &address, id, false);
                            let routes = router.routes();
                            look_up_stream(&edge, &events, &routes, &address, id);
                            events.fanin.memory.lock().unwrap().forget_stream(id);
                            was_reset = true;
                            break;
                        }
                        Ok(None) => break,
                        Err(err) => {
                            hint = err.leader_hint().map(str::to_owned);
                            break;
                        }
                    }
                }
            }
            Err(err) => {
                tracing::debug!(%address, error = %err, "coordinator event stream unavailable");
                hint = err.leader_hint().map(str::to_owned);
            }
        }
        events.fanin.mark(&edge, &address, id, false);
        if was_reset {
            continue;
        }
        // A leader named by the refusal is followed at once. Otherwise the
        // next attempt waits, whichever address it goes to (the router may
        // move on, and this task end).
        if hint.is_none() {
            tokio::select! {
                () = tokio::time::sleep(events.fanin.failure_pause()) => {}
                () = stop.cancelled() => return,
            }
        }
        router.follow(&address, hint).await;
    }
}

/// One event of stream `stream`: translated, delivered, remembered.
fn on_event(edge: &Arc<Edge>, events: &Arc<Events>, stream: u64, segment: u64, event: &RunEvent) {
    let outgoing = {
        let mut memory = events.fanin.memory.lock().unwrap();
        if is_terminal(event) {
            memory.pending.remove(&event.run_id);
            events.fanin.unawait_run(&event.run_id);
        }
        memory.translate_from(stream, event)
    };
    for conn in edge.connections() {
        fanout::deliver(&conn, segment, event, &outgoing);
    }
    events.feed.on_event(edge, events, event);
    edge.backends
        .coordinator
        .learn_canonical(&event.run_id, &event.session_key);
}

/// Looks up the runs of stream `stream` (at `address`) and the awaited runs
/// of the partitions `routes` gives that address (every awaited run while
/// the partitions are not split).
fn look_up_stream(edge: &Edge, events: &Events, routes: &Routes, address: &str, stream: u64) {
    let owned: Option<HashSet<u32>> = routes
        .map
        .is_split()
        .then(|| routes.map.partitions_of(address).into_iter().collect());
    look_up(edge, events, |of_stream, partition| match of_stream {
        Some(s) => s == stream,
        None => match (&owned, partition) {
            (Some(owned), Some(p)) => owned.contains(&p),
            _ => true,
        },
    });
}

/// Queues lookups of the runs `select` picks: those this edge saw start and
/// not end (`select(Some(stream), partition)`) and the awaited ones it did
/// not see start (`select(None, partition)`); the partition is `None` when
/// not known.
fn look_up(edge: &Edge, events: &Events, select: impl Fn(Option<u64>, Option<u32>) -> bool) {
    let router = &edge.backends.coordinator;
    let now = Instant::now();
    let deadline = now + edge.config.coordinator_failover_timeout * 2;
    let mut memory = events.fanin.memory.lock().unwrap();
    let mut runs: Vec<String> = memory
        .unfinished()
        .filter(|(_, key, stream)| select(Some(*stream), router.partition_of_session(key)))
        .map(|(id, _, _)| id.to_owned())
        .collect();
    {
        let awaited = events.fanin.awaited.lock().unwrap();
        runs.extend(
            awaited
                .iter()
                .filter(|run| !memory.knows(run))
                .filter(|run| select(None, router.partition_of_run(run)))
                .cloned(),
        );
    }
    if runs.is_empty() {
        return;
    }
    for run in runs {
        memory
            .pending
            .entry(run)
            .and_modify(|p| p.deadline = p.deadline.max(deadline))
            .or_insert(Pending {
                deadline,
                next_attempt: now,
                in_flight: false,
                attempted: false,
            });
    }
    drop(memory);
    events.fanin.lookups.notify_one();
}

/// Works through `RunMemory::pending` forever, each lookup a task of its
/// own (ended with this one).
async fn look_up_runs(edge: Arc<Edge>, events: Arc<Events>) {
    let mut running = tokio::task::JoinSet::new();
    loop {
        let now = Instant::now();
        let room = LOOKUP_CONCURRENCY.saturating_sub(running.len());
        let (due, next) = {
            let mut memory = events.fanin.memory.lock().unwrap();
            let expired: Vec<String> = memory
                .pending
                .iter()
                .filter(|(_, p)| p.attempted && !p.in_flight && p.deadline <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for run in expired {
                clawgate_telemetry::limited!(warn, run_id = %run, "gave up looking up a run whose end this edge did not see");
                memory.pending.remove(&run);
                memory.forget(&run);
            }
            let mut due = Vec::new();
            let mut next: Option<Instant> = None;
            for (run, pending) in memory.pending.iter_mut() {
                if pending.in_flight {
                    continue;
                }
                if pending.next_attempt <= now && due.len() < room {
                    pending.in_flight = true;
                    due.push(run.clone());
                } else {
                    let at = pending.next_attempt.max(now);
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            (due, next)
        };
        for run in due {
            running.spawn(look_up_one(edge.clone(), events.clone(), run));
        }
        // With no room, the next wake-up is a lookup's end.
        let wake = match next {
            Some(at) if running.len() < LOOKUP_CONCURRENCY => at,
            _ => now + RECHECK,
        };
        tokio::select! {
            () = events.fanin.lookups.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
}

/// One lookup (see the module's documentation).
async fn look_up_one(edge: Arc<Edge>, events: Arc<Events>, run_id: String) {
    let router = &edge.backends.coordinator;
    let open_before = events.fanin.open_streams();
    let got = router.get_at(&run_id).await;
    // Whether the coordinator that answered carries the run in a stream
    // that has been open since before it answered.
    let streamed_by = |address: &str| {
        let still_open = open_before
            .get(address)
            .is_some_and(|n| events.fanin.open_streams().get(address) == Some(n));
        let routes = router.routes();
        let owner = if routes.map.is_split() {
            router
                .partition_of_run(&run_id)
                .and_then(|p| routes.map.owner(p))
                .is_some_and(|o| o.address == address)
        } else {
            routes.current == address
        };
        still_open && owner
    };
    let streamed = match &got {
        Ok((address, _)) => streamed_by(address),
        Err(_) => false,
    };
    let mut memory = events.fanin.memory.lock().unwrap();
    let Some(pending) = memory.pending.get_mut(&run_id) else {
        return; // its end came through a stream meanwhile
    };
    pending.in_flight = false;
    pending.attempted = true;
    pending.next_attempt = Instant::now() + LOOKUP_RETRY;
    let snapshot = match got {
        Ok((_, None)) => {
            // Nobody knows it (an accepted run has a record): nothing to end.
            memory.pending.remove(&run_id);
            drop(memory);
            events.fanin.unawait_run(&run_id);
            return;
        }
        Ok((_, Some(snapshot))) => snapshot,
        Err(err) => {
            tracing::debug!(%run_id, error = %err, "looking up a run failed; retrying");
            return;
        }
    };
    match memory.settle(&snapshot) {
        Some(outgoing) => {
            drop(memory);
            events.fanin.unawait_run(&run_id);
            for conn in edge.connections() {
                fanout::deliver_settled(&conn, &run_id, &outgoing);
            }
        }
        // Still going where a stream follows it: that stream brings its end.
        None if streamed => {
            memory.pending.remove(&run_id);
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_while_any_wanted_stream_is_open() {
        let mut book = StreamBook {
            wanted: vec!["a".into(), "b".into()],
            ..StreamBook::default()
        };
        assert!(!book.any_open(), "nothing open yet");
        book.open.insert("a".into(), (1, None));
        book.open.insert("b".into(), (2, Some(7)));
        assert!(book.any_open(), "one coordinator's stream is enough");
        book.open.insert("b".into(), (2, None));
        assert!(!book.any_open(), "none open");
        // A stream nobody wants any more does not count.
        book.open.insert("c".into(), (3, Some(8)));
        assert!(!book.any_open());
    }
}

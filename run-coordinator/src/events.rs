//! Run events: one ordered log per run (`seq` from 1) and one stream across
//! all runs (`stream_seq` from 1), both bounded and kept for a retention
//! window after a run ends.
//!
//! Every event is appended to its run's log and to the global stream under
//! one lock, and subscribers read the logs themselves (a cursor plus a
//! `Notify` armed while the lock is held), so a subscription that replays and
//! then follows live can neither miss nor repeat an event.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use run_coordinator_api::events::{EventBody, RunEvent, StreamReset};

/// `subscribe_all` from this position delivers only events from now on.
pub const LIVE_ONLY: u64 = u64::MAX;

#[derive(Debug, Clone)]
pub struct HubLimits {
    /// How long a finished run's log stays readable.
    pub retention: Duration,
    /// Most finished logs kept (oldest dropped first).
    pub max_retained_runs: usize,
    /// Most events kept per run (oldest dropped first).
    pub max_events_per_run: usize,
    /// Most events kept in the all-runs stream.
    pub max_stream_events: usize,
}

impl Default for HubLimits {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(600),
            max_retained_runs: 10_000,
            max_events_per_run: 10_000,
            max_stream_events: 100_000,
        }
    }
}

pub struct EventHub {
    epoch: Arc<str>,
    limits: HubLimits,
    state: Mutex<HubState>,
    stream_notify: Notify,
}

struct HubState {
    next_stream_seq: u64,
    stream: VecDeque<Arc<RunEvent>>,
    logs: HashMap<String, RunLog>,
    /// Finished logs in the order they finished, with when they expire.
    finished: VecDeque<(Instant, String)>,
}

struct RunLog {
    session_key: String,
    events: VecDeque<Arc<RunEvent>>,
    /// seq of the next event (the last one is `next_seq - 1`).
    next_seq: u64,
    closed: bool,
    notify: Arc<Notify>,
}

impl RunLog {
    /// At least 1 (seqs start at 1), so `first_kept_seq() - 1` never wraps.
    fn first_kept_seq(&self) -> u64 {
        self.events.front().map_or(self.next_seq, |e| e.seq)
    }

    /// The seq of the last event (0: none yet); `next_seq` starts at 1.
    fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}

impl EventHub {
    pub fn new(epoch: Arc<str>, limits: HubLimits) -> Self {
        Self {
            epoch,
            limits,
            state: Mutex::new(HubState {
                next_stream_seq: 1,
                stream: VecDeque::new(),
                logs: HashMap::new(),
                finished: VecDeque::new(),
            }),
            stream_notify: Notify::new(),
        }
    }

    pub fn epoch(&self) -> &Arc<str> {
        &self.epoch
    }

    fn reset(&self, reason: impl Into<String>) -> StreamReset {
        StreamReset {
            reason: reason.into(),
            epoch: self.epoch.clone(),
        }
    }

    /// Starts a run's log (a no-op when it exists).
    pub fn open(&self, run_id: &str, session_key: &str) {
        let mut state = self.state.lock().unwrap();
        self.expire(&mut state);
        state
            .logs
            .entry(run_id.to_owned())
            .or_insert_with(|| RunLog {
                session_key: session_key.to_owned(),
                events: VecDeque::new(),
                next_seq: 1,
                closed: false,
                notify: Arc::new(Notify::new()),
            });
    }

    /// Appends an event to an open log; `None` when the log is closed or gone.
    pub fn emit(&self, run_id: &str, ts_ms: i64, body: EventBody) -> Option<Arc<RunEvent>> {
        let mut state = self.state.lock().unwrap();
        let stream_seq = state.next_stream_seq;
        let log = state.logs.get_mut(run_id).filter(|log| !log.closed)?;
        let event = Arc::new(RunEvent {
            run_id: run_id.to_owned(),
            session_key: log.session_key.clone(),
            seq: log.next_seq,
            stream_seq,
            epoch: self.epoch.clone(),
            ts_ms,
            body,
        });
        log.next_seq += 1;
        log.events.push_back(event.clone());
        if log.events.len() > self.limits.max_events_per_run {
            log.events.pop_front();
        }
        log.notify.notify_waiters();
        state.next_stream_seq += 1;
        state.stream.push_back(event.clone());
        if state.stream.len() > self.limits.max_stream_events {
            state.stream.pop_front();
        }
        self.stream_notify.notify_waiters();
        Some(event)
    }

    /// Ends a run's log: subscribers drain it and finish; it stays readable
    /// for the retention window.
    pub fn close(&self, run_id: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(log) = state.logs.get_mut(run_id).filter(|log| !log.closed) {
            log.closed = true;
            log.notify.notify_waiters();
            let expires = Instant::now() + self.limits.retention;
            state.finished.push_back((expires, run_id.to_owned()));
        }
        self.expire(&mut state);
    }

    /// Drops a run's log at once (a queued run handed to another
    /// coordinator: its events continue there). Its subscribers end.
    pub fn forget(&self, run_id: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(log) = state.logs.remove(run_id) {
            log.notify.notify_waiters();
        }
    }

    /// The seq of the run's last event (0: none, or no log).
    pub fn last_seq(&self, run_id: &str) -> u64 {
        let state = self.state.lock().unwrap();
        state.logs.get(run_id).map_or(0, RunLog::last_seq)
    }

    fn expire(&self, state: &mut HubState) {
        let now = Instant::now();
        while let Some((expires, _)) = state.finished.front() {
            let over_cap = state.finished.len() > self.limits.max_retained_runs;
            if *expires > now && !over_cap {
                break;
            }
            let (_, run_id) = state.finished.pop_front().expect("checked above");
            state.logs.remove(&run_id);
        }
    }

    /// Events of one run after `after_seq`, then live ones, until the run ends.
    pub fn subscribe_run(
        self: &Arc<Self>,
        run_id: &str,
        after_seq: u64,
        epoch: Option<&str>,
    ) -> Result<RunSubscription, StreamReset> {
        self.check_epoch(epoch)?;
        let mut state = self.state.lock().unwrap();
        self.expire(&mut state);
        let log = state.logs.get(run_id).ok_or_else(|| {
            self.reset(format!(
                "no event log for run {run_id:?} (unknown or expired)"
            ))
        })?;
        // A client can only have seen seqs the log issued: a position past
        // the last one (up to u64::MAX) is refused, so a cursor is never
        // beyond `next_seq - 1` and `cursor + 1` cannot overflow.
        let last_seq = log.last_seq();
        if after_seq > last_seq {
            return Err(self.reset(format!(
                "position {after_seq} is past the last event of run {run_id:?} (last seq {last_seq})"
            )));
        }
        if after_seq < log.first_kept_seq() - 1 {
            return Err(self.reset(format!(
                "events after seq {after_seq} of run {run_id:?} are no longer kept"
            )));
        }
        Ok(RunSubscription {
            hub: self.clone(),
            run_id: run_id.to_owned(),
            cursor: after_seq,
        })
    }

    /// Events of every run after `after_stream_seq`, then live ones, forever.
    pub fn subscribe_all(
        self: &Arc<Self>,
        after_stream_seq: u64,
        epoch: Option<&str>,
    ) -> Result<StreamSubscription, StreamReset> {
        self.check_epoch(epoch)?;
        let state = self.state.lock().unwrap();
        if after_stream_seq == LIVE_ONLY {
            return Ok(StreamSubscription {
                hub: self.clone(),
                cursor: state.next_stream_seq - 1,
            });
        }
        let first_kept = state
            .stream
            .front()
            .map_or(state.next_stream_seq, |e| e.stream_seq);
        // `first_kept >= 1`; comparing against `first_kept - 1` keeps a
        // client's position out of the arithmetic.
        if after_stream_seq < first_kept - 1 || after_stream_seq >= state.next_stream_seq {
            return Err(self.reset(format!(
                "stream position {after_stream_seq} is not available (kept: {first_kept}..{})",
                state.next_stream_seq - 1
            )));
        }
        Ok(StreamSubscription {
            hub: self.clone(),
            cursor: after_stream_seq,
        })
    }

    fn check_epoch(&self, epoch: Option<&str>) -> Result<(), StreamReset> {
        match epoch {
            Some(e) if !e.is_empty() && e != &*self.epoch => Err(self.reset(format!(
                "epoch {e:?} has ended; the coordinator restarted as {:?}",
                self.epoch
            ))),
            _ => Ok(()),
        }
    }
}

pub struct RunSubscription {
    hub: Arc<EventHub>,
    run_id: String,
    cursor: u64,
}

impl RunSubscription {
    /// The next event; `None` once the run's log is closed and drained.
    pub async fn next(&mut self) -> Option<Result<Arc<RunEvent>, StreamReset>> {
        loop {
            let notify = {
                let state = self.hub.state.lock().unwrap();
                let Some(log) = state.logs.get(&self.run_id) else {
                    return Some(Err(self.hub.reset("the run's event log expired")));
                };
                // `cursor <= last_seq` (checked at subscribe, then it only
                // takes seqs of events), so no step here can overflow.
                let first = log.first_kept_seq();
                if self.cursor < first - 1 {
                    return Some(Err(self
                        .hub
                        .reset("the subscriber fell behind the kept events")));
                }
                if self.cursor < log.last_seq() {
                    let event = log.events[(self.cursor + 1 - first) as usize].clone();
                    self.cursor = event.seq;
                    return Some(Ok(event));
                }
                if log.closed {
                    return None;
                }
                log.notify.clone()
            };
            wait_for(&notify, || {
                let state = self.hub.state.lock().unwrap();
                state
                    .logs
                    .get(&self.run_id)
                    .is_none_or(|log| log.closed || self.cursor < log.last_seq())
            })
            .await;
        }
    }
}

pub struct StreamSubscription {
    hub: Arc<EventHub>,
    cursor: u64,
}

impl StreamSubscription {
    pub async fn next(&mut self) -> Result<Arc<RunEvent>, StreamReset> {
        loop {
            {
                let state = self.hub.state.lock().unwrap();
                let first = state
                    .stream
                    .front()
                    .map_or(state.next_stream_seq, |e| e.stream_seq);
                // `cursor < next_stream_seq` (checked at subscribe), as in
                // `RunSubscription::next`.
                if self.cursor < first - 1 {
                    return Err(self.hub.reset("the subscriber fell behind the kept events"));
                }
                if self.cursor < state.next_stream_seq - 1 {
                    let event = state.stream[(self.cursor + 1 - first) as usize].clone();
                    self.cursor = event.stream_seq;
                    return Ok(event);
                }
            }
            let hub = self.hub.clone();
            let cursor = self.cursor;
            wait_for(&hub.stream_notify, || {
                cursor < hub.state.lock().unwrap().next_stream_seq - 1
            })
            .await;
        }
    }
}

/// Waits for `notify`, armed before `ready` is checked, so a notification
/// between the check and the wait is not lost.
async fn wait_for(notify: &Notify, ready: impl Fn() -> bool) {
    let notified = notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if ready() {
        return;
    }
    notified.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use run_coordinator_api::model::RunStatus;

    fn queued() -> EventBody {
        EventBody::Status {
            status: RunStatus::Queued,
            queue_position: 0,
        }
    }

    #[tokio::test]
    async fn a_run_position_past_its_last_event_is_refused_and_the_hub_goes_on() {
        let hub = Arc::new(EventHub::new("e".into(), HubLimits::default()));
        hub.open("r", "k");
        hub.emit("r", 1, queued());
        for from in [2, u64::MAX - 1, u64::MAX] {
            let Err(reset) = hub.subscribe_run("r", from, None) else {
                panic!("position {from} was accepted");
            };
            assert!(
                reset.reason.contains(&format!("position {from} "))
                    && reset.reason.contains("last seq 1"),
                "{}",
                reset.reason
            );
        }
        // The lock is not poisoned: the log still takes events and serves
        // every valid position, the last one included.
        let mut from_last = hub.subscribe_run("r", 1, None).expect("the last seq");
        let mut from_zero = hub.subscribe_run("r", 0, None).expect("the start");
        assert!(hub.emit("r", 2, queued()).is_some());
        assert_eq!(from_zero.next().await.unwrap().unwrap().seq, 1);
        assert_eq!(from_last.next().await.unwrap().unwrap().seq, 2);
        hub.close("r");
        assert!(from_last.next().await.is_none());
    }

    #[tokio::test]
    async fn live_only_follows_the_all_runs_stream_from_now() {
        let hub = Arc::new(EventHub::new("e".into(), HubLimits::default()));
        hub.open("r", "k");
        hub.emit("r", 1, queued());
        let mut live = hub.subscribe_all(LIVE_ONLY, None).expect("live only");
        for from in [2, u64::MAX - 1] {
            assert!(hub.subscribe_all(from, None).is_err(), "position {from}");
        }
        hub.emit("r", 2, queued());
        assert_eq!(live.next().await.unwrap().stream_seq, 2);
    }
}

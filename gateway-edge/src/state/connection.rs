//! An authenticated connection as the rest of the edge sees it: who it is,
//! what it may do, and its outbox.
//!
//! The outbox is a queue with a byte budget (`policy.maxBufferedBytes`): the
//! socket's writer drains it and gives the bytes back. A broadcast event takes
//! the next per-connection `seq` whether or not it fits; a droppable one that
//! does not fit is skipped (the client sees the gap), anything else that does
//! not fit ends the connection with 1008 "slow consumer".

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::limits::RequestCounters;
use super::metrics::{Delivery, EdgeMetrics};
use crate::auth::scopes;
use crate::protocol::frames;

/// Why the edge closes a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseOrder {
    pub code: u16,
    pub reason: String,
}

/// The close reason of a connection whose outbox overflowed.
pub const SLOW_CONSUMER: &str = "slow consumer";

impl CloseOrder {
    /// Whether what is queued is written before the close frame: yes,
    /// unless the connection closes because it does not read.
    pub fn flushes_queued(&self) -> bool {
        self.reason != SLOW_CONSUMER
    }
}

struct OutState {
    seq: u64,
    queued_bytes: usize,
    close: Option<CloseOrder>,
    /// The frames waiting for the writer. A deque, not a channel: an idle
    /// connection's holds no block of slots (a channel allocates its first
    /// block of 32 up front, some 1.5 KiB per connection).
    frames: VecDeque<OutFrame>,
    /// The outbox is gone (its connection closed): the reader ends once it
    /// has taken what is left.
    closed: bool,
    /// The reader is gone (the socket's writer ended): nothing more is
    /// queued.
    reader_gone: bool,
}

/// The outbox's state, shared with its reader.
struct Queue {
    state: Mutex<OutState>,
    /// Wakes the reader: a frame was queued, or the outbox went.
    ready: tokio::sync::Notify,
}

/// A queue keeps at most this capacity once drained (a burst's growth is
/// not kept by an idle connection).
const KEPT_CAPACITY: usize = 8;

/// A frame waiting in an outbox. An event that goes to many connections
/// shares one encoded payload among all their outboxes; each connection's
/// frame (with its own `seq`) is put together only when its writer writes
/// it, so a broadcast to N slow readers holds one payload, not N frames.
#[derive(Debug)]
pub enum OutFrame {
    Text(String),
    Event {
        name: &'static str,
        payload: Arc<str>,
        seq: Option<u64>,
    },
}

impl OutFrame {
    /// The frame's bytes on the wire (what the byte budget counts).
    pub fn wire_len(&self) -> usize {
        match self {
            Self::Text(text) => text.len(),
            Self::Event { name, payload, seq } => frames::event_frame_len(name, payload, *seq),
        }
    }

    /// The frame's text, as the writer sends it.
    pub fn into_text(self) -> String {
        match self {
            Self::Text(text) => text,
            Self::Event { name, payload, seq } => frames::event_frame(name, &payload, seq),
        }
    }
}

pub struct Outbox {
    queue: Arc<Queue>,
    max_bytes: usize,
    metrics: Arc<EdgeMetrics>,
    /// Fires when the connection must close (slow consumer, shutdown).
    pub closing: CancellationToken,
    /// Notified when an answer is queued: it ends the writer's linger.
    pub answered: tokio::sync::Notify,
}

/// What the writer side of a connection receives from its outbox.
pub struct OutboxReader {
    queue: Arc<Queue>,
}

impl OutboxReader {
    /// The next frame, waiting for one; `None` once the outbox is gone and
    /// empty. Cancel-safe: a frame is taken only when it is returned.
    pub async fn recv(&mut self) -> Option<OutFrame> {
        loop {
            let ready = self.queue.ready.notified();
            {
                let mut state = self.queue.state.lock().unwrap();
                if let Some(frame) = take_front(&mut state) {
                    return Some(frame);
                }
                if state.closed {
                    return None;
                }
            }
            ready.await;
        }
    }

    /// The next frame if one is queued.
    pub fn try_recv(&mut self) -> Option<OutFrame> {
        take_front(&mut self.queue.state.lock().unwrap())
    }
}

fn take_front(state: &mut OutState) -> Option<OutFrame> {
    let frame = state.frames.pop_front()?;
    if state.frames.is_empty() && state.frames.capacity() > KEPT_CAPACITY {
        state.frames.shrink_to(KEPT_CAPACITY);
    }
    Some(frame)
}

impl Drop for OutboxReader {
    fn drop(&mut self) {
        let mut state = self.queue.state.lock().unwrap();
        state.reader_gone = true;
        state.frames = VecDeque::new();
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.queue.state.lock().unwrap().closed = true;
        self.queue.ready.notify_one();
    }
}

impl Outbox {
    pub fn new(max_bytes: usize, metrics: Arc<EdgeMetrics>) -> (Self, OutboxReader) {
        let queue = Arc::new(Queue {
            state: Mutex::new(OutState {
                seq: 0,
                queued_bytes: 0,
                close: None,
                frames: VecDeque::new(),
                closed: false,
                reader_gone: false,
            }),
            ready: tokio::sync::Notify::new(),
        });
        let outbox = Self {
            queue: queue.clone(),
            max_bytes,
            metrics,
            closing: CancellationToken::new(),
            answered: tokio::sync::Notify::new(),
        };
        (outbox, OutboxReader { queue })
    }

    fn push(&self, state: &mut OutState, frame: OutFrame, droppable: bool) -> Delivery {
        if state.close.is_some() || state.reader_gone {
            return Delivery::Closed;
        }
        let bytes = frame.wire_len();
        if state.queued_bytes + bytes > self.max_bytes {
            if !droppable {
                self.metrics.slow_consumer_closed();
                self.order_close(
                    state,
                    CloseOrder {
                        code: 1008,
                        reason: SLOW_CONSUMER.into(),
                    },
                );
            }
            return Delivery::OverBudget;
        }
        state.queued_bytes += bytes;
        state.frames.push_back(frame);
        self.queue.ready.notify_one();
        Delivery::Queued
    }

    /// Pushes an event frame and counts what became of it.
    fn push_event(&self, state: &mut OutState, frame: OutFrame, droppable: bool) -> bool {
        let delivery = self.push(state, frame, droppable);
        self.metrics.event(delivery);
        delivery == Delivery::Queued
    }

    fn order_close(&self, state: &mut OutState, order: CloseOrder) {
        if state.close.is_none() {
            state.close = Some(order);
            self.closing.cancel();
        }
    }

    /// A response frame (never dropped): written without the writer's
    /// linger.
    pub fn send_frame(&self, frame: String) -> bool {
        let queued = {
            let mut state = self.queue.state.lock().unwrap();
            self.push(&mut state, OutFrame::Text(frame), false) == Delivery::Queued
        };
        self.answered.notify_one();
        queued
    }

    /// A broadcast event: takes the next `seq`, even when dropped.
    pub fn broadcast(&self, name: &'static str, payload: &Value, droppable: bool) -> bool {
        self.broadcast_encoded(name, &Arc::from(payload.to_string()), droppable)
    }

    /// `broadcast` of a payload already encoded, shared with every other
    /// connection it goes to (a fan-out encodes it once).
    pub fn broadcast_encoded(
        &self,
        name: &'static str,
        payload: &Arc<str>,
        droppable: bool,
    ) -> bool {
        let mut state = self.queue.state.lock().unwrap();
        state.seq += 1;
        let frame = OutFrame::Event {
            name,
            payload: payload.clone(),
            seq: Some(state.seq),
        };
        self.push_event(&mut state, frame, droppable)
    }

    /// A targeted event (no `seq`).
    pub fn targeted(&self, name: &'static str, payload: &Value, droppable: bool) -> bool {
        self.targeted_encoded(name, &Arc::from(payload.to_string()), droppable)
    }

    /// `targeted` of a payload already encoded.
    pub fn targeted_encoded(
        &self,
        name: &'static str,
        payload: &Arc<str>,
        droppable: bool,
    ) -> bool {
        let frame = OutFrame::Event {
            name,
            payload: payload.clone(),
            seq: None,
        };
        let mut state = self.queue.state.lock().unwrap();
        self.push_event(&mut state, frame, droppable)
    }

    /// The writer hands back the bytes of a frame it wrote.
    pub fn written(&self, bytes: usize) {
        let mut state = self.queue.state.lock().unwrap();
        state.queued_bytes = state.queued_bytes.saturating_sub(bytes);
    }

    pub fn close(&self, order: CloseOrder) {
        let mut state = self.queue.state.lock().unwrap();
        self.order_close(&mut state, order);
    }

    pub fn close_order(&self) -> Option<CloseOrder> {
        self.queue.state.lock().unwrap().close.clone()
    }

    pub fn queued_bytes(&self) -> usize {
        self.queue.state.lock().unwrap().queued_bytes
    }
}

pub struct Conn {
    /// Edge-local id (registry key).
    pub id: u64,
    /// `hello-ok.server.connId`.
    pub conn_id: String,
    pub role: String,
    pub scopes: Vec<String>,
    pub tool_events: bool,
    /// Who this connection acts as for ownership checks: its device id, or
    /// its connId when it has no device.
    pub requester: String,
    pub outbox: Outbox,
    pub sessions_subscribed: AtomicBool,
    pub runs: Mutex<ConnRuns>,
    /// Who the client says it is (`connect.params.client`), for presence.
    pub client: ClientInfo,
    /// Sessions whose `session.message` events it asked for.
    pub message_watch: Mutex<HashSet<String>>,
    /// Its requests in flight and role refusals in a row.
    pub requests: RequestCounters,
}

/// The client's self-description at `connect`, and where it connected from.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    pub id: String,
    pub mode: String,
    pub version: String,
    pub platform: String,
    pub device_family: Option<String>,
    pub display_name: Option<String>,
    pub instance_id: Option<String>,
    pub ip: String,
    pub connected_at_ms: i64,
}

/// Per-connection run bookkeeping for `runs.resume`: the runs that arrive
/// through a resume stream instead of the broadcast, and which stretches of
/// the coordinators' all-runs streams the broadcast delivered here.
///
/// The broadcast and the switch of a run to its resume stream happen under
/// this one lock, so for every event of a run exactly one of them delivers
/// it to the connection: the broadcast up to the switch, the resume stream
/// after it. Together with [`BroadcastSpans`] this makes replay-then-live
/// have no gap and no duplicate whichever comes first, the resume request or
/// some of the run's broadcast events.
#[derive(Default)]
pub struct ConnRuns {
    pub resuming: HashSet<String>,
    /// What the broadcast has delivered here, per coordinator stream.
    pub broadcast: BroadcastSpans,
}

/// The broadcast delivered this connection every event of one
/// coordinator's all-runs stream from `first` to `last` (`stream_seq`, in
/// `epoch`), except those of runs it was resuming at the time, which the
/// resume stream delivered. The fanout's stream is contiguous within one
/// `segment`; a new segment (the fanout resubscribed after a reset) starts
/// a new span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastSpan {
    pub segment: u64,
    pub epoch: String,
    pub first: u64,
    pub last: u64,
}

impl BroadcastSpan {
    /// Whether the broadcast already delivered this event here.
    pub fn covers(&self, epoch: &str, stream_seq: u64) -> bool {
        self.epoch == epoch && (self.first..=self.last).contains(&stream_seq)
    }
}

/// Most coordinator streams whose span a connection keeps (the newest).
pub const MAX_BROADCAST_SPANS: usize = 16;

/// One [`BroadcastSpan`] per coordinator epoch: the fanout follows one
/// all-runs stream per coordinator, each numbered by its own epoch and
/// `stream_seq`, their events interleaved. Kept per epoch, each span stays
/// contiguous.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BroadcastSpans {
    /// Oldest first.
    spans: Vec<BroadcastSpan>,
}

impl BroadcastSpans {
    /// Whether the broadcast already delivered this event here.
    pub fn covers(&self, epoch: &str, stream_seq: u64) -> bool {
        self.spans.iter().any(|s| s.covers(epoch, stream_seq))
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The span of `epoch`, if the broadcast delivered any of its events.
    pub fn of_epoch(&self, epoch: &str) -> Option<&BroadcastSpan> {
        self.spans.iter().find(|s| s.epoch == epoch)
    }

    fn note(&mut self, segment: u64, epoch: &str, stream_seq: u64) {
        if let Some(at) = self.spans.iter().position(|s| s.epoch == epoch) {
            let span = &mut self.spans[at];
            if span.segment == segment {
                span.last = stream_seq;
                return;
            }
            self.spans.remove(at);
        }
        if self.spans.len() >= MAX_BROADCAST_SPANS {
            self.spans.remove(0);
        }
        self.spans.push(BroadcastSpan {
            segment,
            epoch: epoch.to_owned(),
            first: stream_seq,
            last: stream_seq,
        });
    }

    fn clear(&mut self) {
        self.spans.clear();
    }
}

impl ConnRuns {
    /// Notes that the broadcast handled the event at `stream_seq` (of
    /// `segment`, `epoch`) for this connection. Segments are numbered
    /// across all the fanout's streams, so one names one stream's stretch.
    pub fn note_broadcast(&mut self, segment: u64, epoch: &str, stream_seq: u64) {
        self.broadcast.note(segment, epoch, stream_seq);
    }
}

impl Conn {
    /// Whether it asked for `key`'s `session.message` events.
    pub fn watches_messages(&self, key: &str) -> bool {
        self.can_read() && self.message_watch.lock().unwrap().contains(key)
    }

    /// The sessions whose `session.message` events it asked for.
    pub fn watched_sessions(&self) -> Vec<String> {
        self.message_watch.lock().unwrap().iter().cloned().collect()
    }

    pub fn is_admin(&self) -> bool {
        self.scopes.iter().any(|s| s == scopes::ADMIN)
    }

    pub fn can_read(&self) -> bool {
        scopes::grants(&self.scopes, scopes::READ)
    }

    pub fn subscribed_to_sessions(&self) -> bool {
        self.sessions_subscribed.load(Ordering::Relaxed)
    }

    /// Switches a run to its resume stream. From now on the broadcast skips
    /// the run here; the events it delivered before are the returned spans'
    /// (the resume stream skips those). `None`: the run is being resumed on
    /// this connection already; `Err(max)`: it resumes `max` runs already.
    pub fn start_resume(&self, run_id: &str, max: usize) -> Result<Option<BroadcastSpans>, usize> {
        let mut runs = self.runs.lock().unwrap();
        if runs.resuming.len() >= max && !runs.resuming.contains(run_id) {
            return Err(max);
        }
        Ok(runs
            .resuming
            .insert(run_id.to_owned())
            .then(|| runs.broadcast.clone()))
    }

    /// Hands a run back to the broadcast. `completed`: the resume stream
    /// delivered the run to its end. When it did not (the stream broke),
    /// events the broadcast skipped meanwhile reached nobody here, and the
    /// spans would claim they had: they are dropped, so that a later resume
    /// repeats events (which a client can recognise by their `seq`) rather
    /// than leave a gap.
    pub fn end_resume(&self, run_id: &str, completed: bool) {
        let mut runs = self.runs.lock().unwrap();
        runs.resuming.remove(run_id);
        if !completed {
            runs.broadcast.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> (Outbox, OutboxReader) {
        Outbox::new(1 << 20, Arc::new(EdgeMetrics::default()))
    }

    #[tokio::test]
    async fn the_outbox_queue_delivers_in_order_and_ends_with_its_outbox() {
        let (outbox, mut reader) = outbox();
        assert!(reader.try_recv().is_none());
        for i in 0..100 {
            assert!(outbox.send_frame(format!("{i}")));
        }
        for i in 0..100 {
            assert_eq!(reader.recv().await.unwrap().into_text(), format!("{i}"));
        }
        // Drained, it keeps no more than a few slots of a burst.
        assert!(reader.queue.state.lock().unwrap().frames.capacity() <= KEPT_CAPACITY);
        // A waiting reader is woken by a frame, and ends once the outbox
        // is gone and empty.
        let waiting = tokio::spawn(async move {
            let first = reader.recv().await.map(OutFrame::into_text);
            (first, reader.recv().await.is_none())
        });
        tokio::task::yield_now().await;
        outbox.send_frame("late".into());
        drop(outbox);
        assert_eq!(waiting.await.unwrap(), (Some("late".into()), true));
    }

    #[test]
    fn nothing_is_queued_once_the_reader_is_gone() {
        let (outbox, reader) = outbox();
        drop(reader);
        // Not a slow consumer: the connection's writer has ended.
        assert!(!outbox.send_frame("answer".into()));
        assert_eq!(outbox.queued_bytes(), 0);
        assert!(outbox.close_order().is_none());
    }

    #[test]
    fn spans_of_interleaved_streams_stay_apart() {
        let mut runs = ConnRuns::default();
        // Two coordinators' streams (segments 1 and 2), interleaved.
        runs.note_broadcast(1, "a", 10);
        runs.note_broadcast(2, "b", 3);
        runs.note_broadcast(1, "a", 11);
        runs.note_broadcast(2, "b", 4);
        runs.note_broadcast(1, "a", 12);
        let spans = &runs.broadcast;
        assert!(spans.covers("a", 10) && spans.covers("a", 12));
        assert!(spans.covers("b", 3) && spans.covers("b", 4));
        assert!(!spans.covers("a", 9) && !spans.covers("a", 13));
        assert!(!spans.covers("b", 5) && !spans.covers("c", 4));
        // A's stream starts over (a reset: a new segment): its span starts
        // again, B's is untouched.
        runs.note_broadcast(3, "a", 20);
        let spans = &runs.broadcast;
        assert!(!spans.covers("a", 12) && spans.covers("a", 20));
        assert!(spans.covers("b", 3));
        assert_eq!(spans.of_epoch("a").unwrap().first, 20);
    }

    #[test]
    fn past_the_bound_the_oldest_streams_span_goes() {
        let mut runs = ConnRuns::default();
        for n in 0..=MAX_BROADCAST_SPANS as u64 {
            runs.note_broadcast(n, &format!("e{n}"), 1);
        }
        assert!(!runs.broadcast.covers("e0", 1));
        assert!(runs.broadcast.covers("e1", 1));
        assert!(runs.broadcast.covers(&format!("e{MAX_BROADCAST_SPANS}"), 1));
    }
}

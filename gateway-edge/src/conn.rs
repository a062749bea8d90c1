//! An authenticated connection as the rest of the edge sees it: who it is,
//! what it may do, and its outbox.
//!
//! The outbox is a queue with a byte budget (`policy.maxBufferedBytes`): the
//! socket's writer drains it and gives the bytes back. A broadcast event takes
//! the next per-connection `seq` whether or not it fits; a droppable one that
//! does not fit is skipped (the client sees the gap), anything else that does
//! not fit ends the connection with 1008 "slow consumer".

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::frames;
use crate::metrics::{Delivery, EdgeMetrics};
use crate::scopes;

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
}

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
    tx: mpsc::UnboundedSender<OutFrame>,
    state: Mutex<OutState>,
    max_bytes: usize,
    metrics: Arc<EdgeMetrics>,
    /// Fires when the connection must close (slow consumer, shutdown).
    pub closing: CancellationToken,
    /// Notified when an answer is queued: it ends the writer's linger.
    pub answered: tokio::sync::Notify,
}

/// What the writer side of a connection receives from its outbox.
pub struct OutboxReader {
    pub rx: mpsc::UnboundedReceiver<OutFrame>,
}

impl Outbox {
    pub fn new(max_bytes: usize, metrics: Arc<EdgeMetrics>) -> (Self, OutboxReader) {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbox = Self {
            tx,
            state: Mutex::new(OutState {
                seq: 0,
                queued_bytes: 0,
                close: None,
            }),
            max_bytes,
            metrics,
            closing: CancellationToken::new(),
            answered: tokio::sync::Notify::new(),
        };
        (outbox, OutboxReader { rx })
    }

    fn push(&self, state: &mut OutState, frame: OutFrame, droppable: bool) -> Delivery {
        if state.close.is_some() {
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
        match self.tx.send(frame) {
            Ok(()) => Delivery::Queued,
            Err(_) => Delivery::Closed,
        }
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
            let mut state = self.state.lock().unwrap();
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
        let mut state = self.state.lock().unwrap();
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
        let mut state = self.state.lock().unwrap();
        self.push_event(&mut state, frame, droppable)
    }

    /// The writer hands back the bytes of a frame it wrote.
    pub fn written(&self, bytes: usize) {
        let mut state = self.state.lock().unwrap();
        state.queued_bytes = state.queued_bytes.saturating_sub(bytes);
    }

    pub fn close(&self, order: CloseOrder) {
        let mut state = self.state.lock().unwrap();
        self.order_close(&mut state, order);
    }

    pub fn close_order(&self) -> Option<CloseOrder> {
        self.state.lock().unwrap().close.clone()
    }

    pub fn queued_bytes(&self) -> usize {
        self.state.lock().unwrap().queued_bytes
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
    pub requests: crate::request_limits::RequestCounters,
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
/// through a resume stream instead of the broadcast, and which stretch of
/// the coordinator's all-runs stream the broadcast delivered here.
///
/// The broadcast and the switch of a run to its resume stream happen under
/// this one lock, so for every event of a run exactly one of them delivers
/// it to the connection: the broadcast up to the switch, the resume stream
/// after it. Together with [`BroadcastSpan`] this makes replay-then-live
/// have no gap and no duplicate whichever comes first, the resume request or
/// some of the run's broadcast events.
#[derive(Default)]
pub struct ConnRuns {
    pub resuming: HashSet<String>,
    /// What the broadcast has delivered here; `None` before its first event.
    pub broadcast: Option<BroadcastSpan>,
}

/// The broadcast delivered this connection every event of the coordinator's
/// all-runs stream from `first` to `last` (`stream_seq`, in `epoch`), except
/// those of runs it was resuming at the time, which the resume stream
/// delivered. The fanout's stream is contiguous within one `segment`; a new
/// segment (the fanout resubscribed after a reset) starts a new span.
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

impl ConnRuns {
    /// Notes that the broadcast handled the event at `stream_seq` (of
    /// `segment`, `epoch`) for this connection.
    pub fn note_broadcast(&mut self, segment: u64, epoch: &str, stream_seq: u64) {
        match &mut self.broadcast {
            Some(span) if span.segment == segment && span.epoch == epoch => {
                span.last = stream_seq;
            }
            span => {
                *span = Some(BroadcastSpan {
                    segment,
                    epoch: epoch.to_owned(),
                    first: stream_seq,
                    last: stream_seq,
                });
            }
        }
    }
}

impl Conn {
    /// Whether it asked for `key`'s `session.message` events.
    pub fn watches_messages(&self, key: &str) -> bool {
        self.can_read() && self.message_watch.lock().unwrap().contains(key)
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
    /// the run here; the events it delivered before are the returned span's
    /// (the resume stream skips those). `None`: the run is being resumed on
    /// this connection already.
    pub fn start_resume(&self, run_id: &str) -> Option<Option<BroadcastSpan>> {
        let mut runs = self.runs.lock().unwrap();
        runs.resuming
            .insert(run_id.to_owned())
            .then(|| runs.broadcast.clone())
    }

    /// Hands a run back to the broadcast. `completed`: the resume stream
    /// delivered the run to its end. When it did not (the stream broke),
    /// events the broadcast skipped meanwhile reached nobody here, and the
    /// span would claim they had: it is dropped, so that a later resume
    /// repeats events (which a client can recognise by their `seq`) rather
    /// than leave a gap.
    pub fn end_resume(&self, run_id: &str, completed: bool) {
        let mut runs = self.runs.lock().unwrap();
        runs.resuming.remove(run_id);
        if !completed {
            runs.broadcast = None;
        }
    }
}

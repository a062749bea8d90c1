//! Delivery of the protocol events a run event became (`translate.rs`) to
//! this edge's connections, by the v4 rules (scopes, caps, subscriptions,
//! resumes).

use run_coordinator_api::events::RunEvent;

use super::translate::Outgoing;
use crate::state::connection::Conn;

/// Events this edge emits (advertised in `hello-ok.features.events`).
pub const SERVED_EVENTS: &[&str] = &[
    "connect.challenge",
    "agent",
    "chat",
    "sessions.changed",
    "session.message",
    "session.tool",
    "presence",
    "tick",
    "health",
    "shutdown",
];

/// Delivers the protocol events of one run event to one connection, by the
/// v4 rules: run events need `operator.read`; tool events only with the
/// `tool-events` cap; `sessions.changed` and `session.tool` only to
/// subscribers; a run the
/// connection resumes comes through its resume stream instead. `segment`
/// numbers the contiguous stretches of the coordinators' all-runs streams
/// (across all of them, `fanin.rs`).
pub fn deliver(conn: &Conn, segment: u64, event: &RunEvent, outgoing: &[Outgoing]) {
    if !conn.can_read() {
        return;
    }
    // Held while queueing, so a resume switch sees each event either
    // delivered here or left to the resume stream (see `ConnRuns`).
    let mut runs = conn.runs.lock().unwrap();
    runs.note_broadcast(segment, &event.epoch, event.stream_seq);
    if runs.resuming.contains(&event.run_id) {
        return;
    }
    deliver_unfiltered(conn, outgoing);
}

/// Sends protocol events to a connection (for the resume stream, which
/// bypasses the resuming filter).
pub fn deliver_unfiltered(conn: &Conn, outgoing: &[Outgoing]) {
    for item in outgoing {
        if item.tool_stream {
            if conn.tool_events {
                conn.outbox
                    .targeted_encoded(item.name, &item.payload, item.droppable);
            }
        } else if item.sessions_only {
            if conn.subscribed_to_sessions() {
                conn.outbox
                    .targeted_encoded(item.name, &item.payload, item.droppable);
            }
        } else {
            conn.outbox
                .broadcast_encoded(item.name, &item.payload, item.droppable);
        }
    }
}

/// `deliver` for events made from a snapshot: they belong to no position of
/// the stream.
pub(crate) fn deliver_settled(conn: &Conn, run_id: &str, outgoing: &[Outgoing]) {
    if !conn.can_read() || conn.runs.lock().unwrap().resuming.contains(run_id) {
        return;
    }
    deliver_unfiltered(conn, outgoing);
}

//! Run events from the coordinators to the clients: every run event of the
//! fan-in's streams (`fanin.rs`: one `Subscribe(all)` per coordinator that
//! owns partitions) is turned into the protocol's `agent` and `chat` events
//! here and delivered to this edge's connections.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use clawgate_proto::run_coordinator::v1 as pb;
use serde_json::{Value, json};

use crate::conn::Conn;
use crate::edge::Edge;
use crate::frames::without_nulls;

/// Events this edge emits (advertised in `hello-ok.features.events`).
pub const SERVED_EVENTS: &[&str] = &[
    "connect.challenge",
    "agent",
    "chat",
    "sessions.changed",
    "session.message",
    "presence",
    "tick",
    "health",
    "shutdown",
];

/// A protocol event derived from a run event, and who may receive it.
pub struct Outgoing {
    pub name: &'static str,
    /// The payload, encoded once for every connection it goes to.
    pub payload: std::sync::Arc<str>,
    /// Dropped (with a seq gap) for a slow consumer rather than closing it.
    pub droppable: bool,
    /// Only to connections with the `tool-events` cap, targeted (no seq).
    pub tool_stream: bool,
    /// Only to `sessions.subscribe` subscribers, targeted (no seq).
    pub sessions_only: bool,
}

/// What the translation remembers per run: the text so far (for `final`
/// and `aborted` chat events) and when it started; for the fan-in, which
/// stream its events came from and the runs to look up.
#[derive(Default)]
pub struct RunMemory {
    runs: HashMap<String, RunEntry>,
    /// Runs whose terminal events were sent from their snapshot after a
    /// failover (`settle`): a terminal event arriving later for one of them
    /// is a repeat and is left out.
    settled: HashSet<String>,
    /// Runs whose end may have happened out of this edge's sight (their
    /// stream started over, or their partition moved): looked up on the
    /// coordinator owning them now until terminal (`fanin.rs`). A terminal
    /// event from a stream takes a run off.
    pub(crate) pending: HashMap<String, Pending>,
}

#[derive(Default)]
struct RunEntry {
    text: String,
    started: i64,
    session_key: String,
    /// The fan-in stream its last event came from (0: none).
    stream: u64,
}

/// A run to look up (see `RunMemory::pending`).
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// Given up after this (a run still not terminal by then ends through
    /// its stream, if at all).
    pub deadline: Instant,
    pub next_attempt: Instant,
    pub in_flight: bool,
    /// Looked up at least once (only then is it given up on).
    pub attempted: bool,
}

/// Most runs remembered as settled (each is forgotten when its repeat
/// arrives).
const MAX_SETTLED: usize = 10_000;

/// The name of a run status on the wire.
pub fn status_name(raw: i32) -> &'static str {
    use clawgate_proto::session_store::v1::RunStatus as S;
    match S::try_from(raw).unwrap_or(S::Unspecified) {
        S::Ok => "ok",
        S::Error => "error",
        S::Aborted => "aborted",
        S::Timeout => "timeout",
        S::Superseded => "superseded",
        S::Lost => "lost",
        S::Accepted => "accepted",
        S::Queued => "queued",
        S::Running => "running",
        S::Unspecified => "unknown",
    }
}

fn chat_message(text: &str, ts: i64) -> Value {
    json!({ "role": "assistant", "content": [{ "type": "text", "text": text }], "timestamp": ts })
}

/// The protocol's stop reason for how a run ended.
pub fn stop_reason_for(status: &str, stop_reason: Option<&str>) -> String {
    match status {
        // An abort by request is "rpc" on the wire.
        "aborted" if stop_reason.is_none_or(|r| r == "aborted") => "rpc".into(),
        "timeout" => "timeout".into(),
        "superseded" => "superseded".into(),
        _ => stop_reason.unwrap_or("stop").to_owned(),
    }
}

impl RunMemory {
    /// Runs that started and have not ended, as far as this memory knows,
    /// each with its session key and the stream its events came from.
    pub fn unfinished(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.runs
            .iter()
            .map(|(id, e)| (id.as_str(), e.session_key.as_str(), e.stream))
    }

    pub fn knows(&self, run_id: &str) -> bool {
        self.runs.contains_key(run_id)
    }

    /// Forgets the runs of `stream` (it started over: what it said of them
    /// may be stale).
    pub fn forget_stream(&mut self, stream: u64) {
        self.runs.retain(|_, e| e.stream != stream);
    }

    /// Forgets one run (given up on).
    pub fn forget(&mut self, run_id: &str) {
        self.runs.remove(run_id);
    }

    /// The protocol events that end a run, from its terminal snapshot: for
    /// a run whose end this edge did not see (its coordinator went away and
    /// the new owner settled it, `lost` say). `None` if it is not terminal.
    pub fn settle(&mut self, snapshot: &pb::RunSnapshot) -> Option<Vec<Outgoing>> {
        let status = status_name(snapshot.status);
        if matches!(status, "accepted" | "queued" | "running" | "unknown") {
            return None;
        }
        let phase = match status {
            "ok" | "aborted" | "timeout" | "superseded" => pb::lifecycle::Phase::End,
            _ => pb::lifecycle::Phase::Error,
        };
        let event = pb::RunEvent {
            run_id: snapshot.run_id.clone(),
            session_key: snapshot.session_key.clone(),
            seq: snapshot.last_seq,
            stream_seq: 0,
            epoch: snapshot.epoch.clone(),
            ts_ms: snapshot
                .ended_at_ms
                .unwrap_or_else(session_store_api::store::now_ms),
            body: Some(pb::run_event::Body::Lifecycle(pb::Lifecycle {
                phase: phase as i32,
                status: snapshot.status,
                stop_reason: snapshot.stop_reason.clone(),
                error: snapshot.error.clone(),
            })),
        };
        // The final text: the run's own when this memory has none (a run
        // it never saw, or forgot at a reset).
        let entry = self.runs.entry(snapshot.run_id.clone()).or_default();
        if entry.text.is_empty() {
            entry.text = snapshot.text.clone();
        }
        if entry.started == 0 {
            entry.started = snapshot.started_at_ms.unwrap_or_default();
        }
        self.pending.remove(&snapshot.run_id);
        let outgoing = self.translate(&event);
        if self.settled.len() >= MAX_SETTLED {
            self.settled.clear();
        }
        self.settled.insert(snapshot.run_id.clone());
        Some(outgoing)
    }

    /// The protocol events for one run event.
    pub fn translate(&mut self, event: &pb::RunEvent) -> Vec<Outgoing> {
        self.translate_from(0, event)
    }

    /// `translate` of an event of the fan-in's stream `stream`.
    pub fn translate_from(&mut self, stream: u64, event: &pb::RunEvent) -> Vec<Outgoing> {
        use pb::run_event::Body;
        let run_id = &event.run_id;
        let session_key = &event.session_key;
        let agent = |stream: &str, data: Value| {
            json!({
                "runId": run_id, "sessionKey": session_key, "agentId": "main",
                "stream": stream, "data": data, "seq": event.seq, "ts": event.ts_ms,
            })
        };
        let plain = |name, payload: Value| Outgoing {
            name,
            payload: payload.to_string().into(),
            droppable: false,
            tool_stream: false,
            sessions_only: false,
        };
        let mut out = Vec::new();
        match &event.body {
            Some(Body::Lifecycle(life)) if life.phase == pb::lifecycle::Phase::Start as i32 => {
                self.runs.insert(
                    run_id.clone(),
                    RunEntry {
                        text: String::new(),
                        started: event.ts_ms,
                        session_key: session_key.clone(),
                        stream,
                    },
                );
                out.push(plain(
                    "agent",
                    agent(
                        "lifecycle",
                        json!({ "phase": "start", "startedAt": event.ts_ms }),
                    ),
                ));
                out.push(Outgoing {
                    sessions_only: true,
                    droppable: true,
                    ..plain("sessions.changed", json!({
                        "sessionKey": session_key, "agentId": "main", "phase": "start", "runId": run_id, "ts": event.ts_ms,
                    }))
                });
            }
            Some(Body::Lifecycle(_)) if self.settled.remove(run_id) => {}
            Some(Body::Lifecycle(life)) => {
                let RunEntry { text, started, .. } = self.runs.remove(run_id).unwrap_or_default();
                let status = status_name(life.status);
                let stop_reason = stop_reason_for(status, life.stop_reason.as_deref());
                let error = life.error.as_ref();
                let ended = life.phase == pb::lifecycle::Phase::Error as i32;
                let data = without_nulls(json!({
                    "phase": if ended { "error" } else { "end" },
                    "startedAt": (started > 0).then_some(started),
                    "endedAt": event.ts_ms,
                    "aborted": status == "aborted",
                    "stopReason": stop_reason,
                    "status": status,
                    "error": error.map(|e| e.message.clone()),
                }));
                out.push(plain("agent", agent("lifecycle", data)));
                let message = (!text.is_empty()).then(|| chat_message(&text, event.ts_ms));
                let chat = match status {
                    "ok" => json!({
                        "runId": run_id, "sessionKey": session_key, "agentId": "main", "seq": event.seq,
                        "state": "final", "stopReason": stop_reason, "message": message,
                    }),
                    "aborted" | "timeout" | "superseded" => json!({
                        "runId": run_id, "sessionKey": session_key, "agentId": "main", "seq": event.seq,
                        "state": "aborted", "stopReason": stop_reason, "message": message,
                    }),
                    _ => json!({
                        "runId": run_id, "sessionKey": session_key, "agentId": "main", "seq": event.seq,
                        "state": "error", "message": message,
                        "errorMessage": error.map_or_else(|| format!("run {status}"), |e| e.message.clone()),
                        "errorKind": error.map_or("unknown", |e| chat_error_kind(&e.kind)),
                        // A kind outside the protocol's (a coordinator's
                        // `lost`, `shutdown`, `store`, …) is kept here.
                        "errorDetail": error
                            .filter(|e| chat_error_kind(&e.kind) != e.kind)
                            .map(|e| json!({ "providerRuntimeFailureKind": e.kind })),
                    }),
                };
                out.push(plain("chat", without_nulls(chat)));
                out.push(Outgoing {
                    sessions_only: true,
                    droppable: true,
                    ..plain("sessions.changed", json!({
                        "sessionKey": session_key, "agentId": "main", "phase": "end", "runId": run_id, "ts": event.ts_ms,
                    }))
                });
            }
            Some(Body::Assistant(assistant)) => {
                let entry = self.runs.entry(run_id.clone()).or_default();
                entry.text = assistant.text.clone();
                entry.stream = stream;
                if entry.session_key.is_empty() {
                    entry.session_key = session_key.clone();
                }
                // Assistant events carry the text so far, so a dropped one
                // loses nothing the next one does not repeat: droppable.
                out.push(Outgoing {
                    droppable: true,
                    ..plain(
                        "agent",
                        agent(
                            "assistant",
                            json!({ "text": assistant.text, "delta": assistant.delta }),
                        ),
                    )
                });
                out.push(Outgoing {
                    droppable: true,
                    ..plain("chat", json!({
                        "runId": run_id, "sessionKey": session_key, "agentId": "main", "seq": event.seq,
                        "state": "delta", "deltaText": assistant.delta,
                        "message": chat_message(&assistant.text, event.ts_ms),
                    }))
                });
            }
            Some(Body::Tool(tool)) => {
                let phase = match pb::tool::Phase::try_from(tool.phase) {
                    Ok(pb::tool::Phase::Start) => "start",
                    Ok(pb::tool::Phase::Update) => "update",
                    _ => "result",
                };
                let data_key = match phase {
                    "start" => "args",
                    "update" => "partialResult",
                    _ => "result",
                };
                let mut data = json!({ "phase": phase, "toolCallId": tool.tool_call_id, "isError": tool.is_error });
                if !tool.name.is_empty() {
                    data["name"] = json!(tool.name);
                }
                data[data_key] =
                    serde_json::from_str(&tool.data_json).unwrap_or_else(|_| json!(tool.data_json));
                out.push(Outgoing {
                    tool_stream: true,
                    ..plain("agent", agent("tool", data))
                });
            }
            Some(Body::Status(_)) | None => {}
        }
        out
    }
}

/// Delivers the protocol events of one run event to one connection, by the
/// v4 rules: run events need `operator.read`; tool events only with the
/// `tool-events` cap; `sessions.changed` only to subscribers; a run the
/// connection resumes comes through its resume stream instead. `segment`
/// numbers the contiguous stretches of the coordinators' all-runs streams
/// (across all of them, `fanin.rs`).
pub fn deliver(conn: &Conn, segment: u64, event: &pb::RunEvent, outgoing: &[Outgoing]) {
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

/// Follows the coordinators' event streams forever (`fanin::run`).
pub async fn run(edge: Arc<Edge>) {
    crate::fanin::run(edge).await;
}

/// The protocol's `errorKind` for a run error's kind: its own when the
/// protocol has it, else `unknown`.
fn chat_error_kind(kind: &str) -> &str {
    match kind {
        "refusal" | "timeout" | "rate_limit" | "context_length" => kind,
        _ => "unknown",
    }
}

pub(crate) fn is_terminal(event: &pb::RunEvent) -> bool {
    matches!(&event.body, Some(pb::run_event::Body::Lifecycle(life))
        if life.phase != pb::lifecycle::Phase::Start as i32)
}

/// `deliver` for events made from a snapshot: they belong to no position of
/// the stream.
pub(crate) fn deliver_settled(conn: &Conn, run_id: &str, outgoing: &[Outgoing]) {
    if !conn.can_read() || conn.runs.lock().unwrap().resuming.contains(run_id) {
        return;
    }
    deliver_unfiltered(conn, outgoing);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_errors_use_the_protocols_kinds() {
        for kind in ["refusal", "timeout", "rate_limit", "context_length"] {
            assert_eq!(chat_error_kind(kind), kind);
        }
        for kind in ["lost", "shutdown", "store", "session_busy", ""] {
            assert_eq!(chat_error_kind(kind), "unknown");
        }
    }
}

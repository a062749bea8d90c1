//! Run events from the coordinators turned into the protocol's `agent`,
//! `chat` and `sessions.changed` events, with what the translation must
//! remember per run (the text so far, when it started, which stream it
//! came from) and the runs the fan-in must look up.

use std::collections::{HashMap, HashSet};

use run_coordinator_api::events::{EventBody, LifecyclePhase, RunEvent, ToolPhase};
use run_coordinator_api::model::{RunSnapshot, RunStatus};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::protocol::frames::without_nulls;

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
    pub fn settle(&mut self, snapshot: &RunSnapshot) -> Option<Vec<Outgoing>> {
        if !snapshot.status.is_terminal() {
            return None;
        }
        let phase = match snapshot.status {
            RunStatus::Ok | RunStatus::Aborted | RunStatus::Timeout | RunStatus::Superseded => {
                LifecyclePhase::End
            }
            _ => LifecyclePhase::Error,
        };
        let event = RunEvent {
            run_id: snapshot.run_id.clone(),
            session_key: snapshot.session_key.clone(),
            seq: snapshot.last_seq,
            stream_seq: 0,
            epoch: snapshot.epoch.as_str().into(),
            ts_ms: snapshot
                .ended_at_ms
                .unwrap_or_else(clawgate_common::clock::now_ms),
            body: EventBody::Lifecycle {
                phase,
                status: Some(snapshot.status),
                stop_reason: snapshot.outcome.stop_reason.clone(),
                error: snapshot.outcome.error.clone(),
            },
        };
        // The final text: the run's own when this memory has none (a run
        // it never saw, or forgot at a reset).
        let entry = self.runs.entry(snapshot.run_id.clone()).or_default();
        if entry.text.is_empty() {
            entry.text = snapshot.outcome.text.clone();
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
    pub fn translate(&mut self, event: &RunEvent) -> Vec<Outgoing> {
        self.translate_from(0, event)
    }

    /// `translate` of an event of the fan-in's stream `stream`.
    pub fn translate_from(&mut self, stream: u64, event: &RunEvent) -> Vec<Outgoing> {
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
            EventBody::Lifecycle {
                phase: LifecyclePhase::Start,
                ..
            } => {
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
            EventBody::Lifecycle { .. } if self.settled.remove(run_id) => {}
            EventBody::Lifecycle {
                phase,
                status,
                stop_reason,
                error,
            } => {
                let RunEntry { text, started, .. } = self.runs.remove(run_id).unwrap_or_default();
                let status = status.map_or("unknown", RunStatus::as_str);
                let stop_reason = stop_reason_for(status, stop_reason.as_deref());
                let error = error.as_ref();
                let ended = *phase == LifecyclePhase::Error;
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
            EventBody::Assistant { text, delta } => {
                let entry = self.runs.entry(run_id.clone()).or_default();
                entry.text = text.clone();
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
                        agent("assistant", json!({ "text": text, "delta": delta })),
                    )
                });
                out.push(Outgoing {
                    droppable: true,
                    ..plain("chat", json!({
                        "runId": run_id, "sessionKey": session_key, "agentId": "main", "seq": event.seq,
                        "state": "delta", "deltaText": delta,
                        "message": chat_message(text, event.ts_ms),
                    }))
                });
            }
            EventBody::Tool {
                phase,
                tool_call_id,
                name,
                data_json,
                is_error,
            } => {
                let (phase, data_key) = match phase {
                    ToolPhase::Start => ("start", "args"),
                    ToolPhase::Update => ("update", "partialResult"),
                    ToolPhase::Result => ("result", "result"),
                };
                let mut data =
                    json!({ "phase": phase, "toolCallId": tool_call_id, "isError": is_error });
                if !name.is_empty() {
                    data["name"] = json!(name);
                }
                data[data_key] =
                    serde_json::from_str(data_json).unwrap_or_else(|_| json!(data_json));
                let payload = agent("tool", data);
                // The same, as `session.tool`, to `sessions.subscribe`rs.
                out.push(Outgoing {
                    sessions_only: true,
                    droppable: true,
                    ..plain("session.tool", payload.clone())
                });
                out.push(Outgoing {
                    tool_stream: true,
                    ..plain("agent", payload)
                });
            }
            EventBody::Status { .. } => {}
        }
        out
    }
}

/// The protocol's `errorKind` for a run error's kind: its own when the
/// protocol has it, else `unknown`.
fn chat_error_kind(kind: &str) -> &str {
    match kind {
        "refusal" | "timeout" | "rate_limit" | "context_length" => kind,
        _ => "unknown",
    }
}

/// Whether a run event ends its run.
pub fn is_terminal(event: &RunEvent) -> bool {
    matches!(&event.body, EventBody::Lifecycle { phase, .. } if *phase != LifecyclePhase::Start)
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

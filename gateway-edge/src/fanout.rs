//! Run events from the coordinator to the clients. Each edge holds ONE
//! multiplexed `Subscribe(all)` stream (resumed from the last `stream_seq`
//! after a coordinator restart or a broken stream) and turns every run event
//! into the protocol's `agent` and `chat` events for its own connections.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

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
/// and `aborted` chat events) and when it started.
#[derive(Default)]
pub struct RunMemory {
    runs: HashMap<String, (String, i64)>,
    /// Runs whose terminal events were sent from their snapshot after a
    /// failover (`settle`): a terminal event arriving later for one of them
    /// is a repeat and is left out.
    settled: HashSet<String>,
}

/// Most runs remembered as settled (each is forgotten when its repeat
/// arrives, or with the memory at the next stream reset).
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
    /// Runs that started and have not ended, as far as this memory knows.
    pub fn unfinished(&self) -> Vec<String> {
        self.runs.keys().cloned().collect()
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
        if let Some(entry) = self.runs.get_mut(&snapshot.run_id)
            && entry.0.is_empty()
        {
            entry.0 = snapshot.text.clone();
        }
        let outgoing = self.translate(&event);
        if self.settled.len() >= MAX_SETTLED {
            self.settled.clear();
        }
        self.settled.insert(snapshot.run_id.clone());
        Some(outgoing)
    }

    /// The protocol events for one run event.
    pub fn translate(&mut self, event: &pb::RunEvent) -> Vec<Outgoing> {
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
                self.runs
                    .insert(run_id.clone(), (String::new(), event.ts_ms));
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
                let (text, started) = self.runs.remove(run_id).unwrap_or_default();
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
                entry.0 = assistant.text.clone();
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
/// numbers the fanout's contiguous stretches of the all-runs stream.
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

/// Follows the coordinator leader's event stream forever, reconnecting with
/// backoff. A stream that ends or fails moves to the coordinator
/// `Router::follow` picks. When the stream starts over under
/// another epoch (a failover, a restart), the runs this edge saw start and
/// not end are looked up on the coordinator now serving: one that ended
/// meanwhile (`lost` in a failover, say) reaches clients as its terminal
/// events rather than as silence.
pub async fn run(edge: Arc<Edge>) {
    let mut memory = RunMemory::default();
    // Live only at first: clients replay older events with `runs.resume`.
    let mut position: Option<(String, u64)> = None;
    // A new segment each time the stream starts live (a gap may precede it).
    let mut segment = 0u64;
    // After a reset: the runs to look up once a live stream is open again
    // (with every awaited run).
    let mut unsettled: Option<Vec<String>> = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        if position.is_none() {
            segment += 1;
        }
        let (epoch, from_seq) = position.clone().unwrap_or((String::new(), u64::MAX));
        let request = pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::All(true)),
            from_seq,
            epoch,
        };
        let address = edge.backends.coordinator.current_address();
        let Ok(mut client) = edge.backends.coordinator.client_at(&address) else {
            return;
        };
        let mut hint = None;
        // A reset is an answer, not a failure: resubscribe live at once, to
        // the same coordinator.
        let mut was_reset = false;
        match client.subscribe(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                edge.fanout_ready
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                loop {
                    match stream.message().await {
                        Ok(Some(pb::SubscribeResponse {
                            item: Some(pb::subscribe_response::Item::Event(event)),
                        })) => {
                            backoff = Duration::from_millis(100);
                            position = Some((event.epoch.clone(), event.stream_seq));
                            if is_terminal(&event) {
                                edge.awaited.lock().unwrap().remove(&event.run_id);
                            }
                            let outgoing = memory.translate(&event);
                            for conn in edge.connections() {
                                deliver(&conn, segment, &event, &outgoing);
                            }
                            edge.session_feed.on_event(&edge, &event);
                        }
                        Ok(Some(pb::SubscribeResponse {
                            item: Some(pb::subscribe_response::Item::Subscribed(_)),
                        })) => {
                            // Subscribed before looking up: whatever ends
                            // after the lookup comes through this stream.
                            if let Some(mut runs) = unsettled.take() {
                                runs.extend(edge.awaited.lock().unwrap().iter().cloned());
                                runs.sort_unstable();
                                runs.dedup();
                                settle(&edge, &mut client, &mut memory, runs).await;
                            }
                        }
                        Ok(Some(pb::SubscribeResponse {
                            item: Some(pb::subscribe_response::Item::Reset(reset)),
                        })) => {
                            tracing::warn!(reason = %reset.reason, epoch = %reset.epoch, "coordinator event stream reset; following live");
                            position = None;
                            unsettled
                                .get_or_insert_with(Vec::new)
                                .extend(memory.unfinished());
                            memory = RunMemory::default();
                            was_reset = true;
                            break;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(status) => {
                            hint = crate::coordinators::leader_hint(&status);
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                tracing::debug!(error = %status, "coordinator event stream unavailable");
                hint = crate::coordinators::leader_hint(&status);
            }
        }
        edge.fanout_ready
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if was_reset {
            continue;
        }
        edge.backends.coordinator.follow(&address, hint).await;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Sends the terminal events of the `runs` that ended where this edge did
/// not see it, from their snapshots on the coordinator serving now.
async fn settle(
    edge: &Arc<Edge>,
    client: &mut crate::coordinators::CoordinatorClient,
    memory: &mut RunMemory,
    runs: Vec<String>,
) {
    for run_id in runs {
        let got = client.get(pb::GetRequest { run_id }).await;
        let Some(snapshot) = got.ok().and_then(|r| r.into_inner().snapshot) else {
            continue;
        };
        if let Some(outgoing) = memory.settle(&snapshot) {
            edge.awaited.lock().unwrap().remove(&snapshot.run_id);
            for conn in edge.connections() {
                deliver_settled(&conn, &snapshot.run_id, &outgoing);
            }
        }
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

fn is_terminal(event: &pb::RunEvent) -> bool {
    matches!(&event.body, Some(pb::run_event::Body::Lifecycle(life))
        if life.phase != pb::lifecycle::Phase::Start as i32)
}

/// `deliver` for events made from a snapshot: they belong to no position of
/// the stream.
fn deliver_settled(conn: &Conn, run_id: &str, outgoing: &[Outgoing]) {
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

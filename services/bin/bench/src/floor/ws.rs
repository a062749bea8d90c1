//! The WebSocket side of the floors: the gateway's frames and nothing
//! else. A connection gets the challenge, answers `connect` with a
//! `hello-ok`, and every `req` with a `res` (each request on a task of its
//! own, answers and events through the connection's outbox, as the edge
//! does). `chat.send` is admitted through service A when there is one
//! (floors b and c), then its run is played back: lifecycle start, the
//! echo's chunks (one every pace) as `agent` assistant and `chat` delta
//! pairs coalesced as the coordinator does, lifecycle end and the `chat`
//! final, each with the connection's own
//! `seq`; to every connection, as the edge broadcasts, on the floor of
//! `fanout` (a), and to the sender only on the request path's floors (b,
//! c), so that what they measure is the request path, not the broadcast.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_common::clock::now_ms;
use clawgate_proto::run_coordinator::v1 as rc;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::Channel;

use crate::plan::Echo;

type Coordinator = rc::run_coordinator_client::RunCoordinatorClient<Channel>;

/// Deltas go out at most once per this, as the coordinator coalesces them
/// (its `--delta-interval` default): the same events per run as the real
/// path.
const DELTA_INTERVAL: Duration = Duration::from_millis(150);
/// Frames written per flush at most.
const WRITE_BATCH: usize = 64;

struct Conn {
    outbox: mpsc::UnboundedSender<String>,
    /// Broadcast events sent so far.
    seq: AtomicU64,
}

/// One floor's WebSocket server.
pub struct Hub {
    echo: Echo,
    /// Service A, for floors (b) and (c).
    coordinator: Option<Coordinator>,
    /// Runs are played to every connection (else to their sender).
    broadcast: bool,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_conn: AtomicU64,
}

impl Hub {
    pub fn new(echo: Echo, coordinator: Option<Coordinator>, broadcast: bool) -> Arc<Self> {
        Arc::new(Self {
            echo,
            coordinator,
            broadcast,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        })
    }

    /// Sends a run's event to every connection, or to its sender.
    fn deliver(&self, sender: &Arc<Conn>, name: &str, payload: &Value) {
        let payload = payload.to_string();
        let conns: Vec<Arc<Conn>> = if self.broadcast {
            self.conns.lock().unwrap().values().cloned().collect()
        } else {
            vec![sender.clone()]
        };
        for conn in conns {
            let seq = conn.seq.fetch_add(1, Ordering::Relaxed) + 1;
            let _ = conn.outbox.send(format!(
                r#"{{"type":"event","event":"{name}","payload":{payload},"seq":{seq}}}"#
            ));
        }
    }
}

/// Accepts connections on `listener` until the runtime stops.
pub async fn serve(hub: Arc<Hub>, listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(connection(hub.clone(), stream));
    }
}

fn response(id: &Value, payload: Value) -> String {
    json!({ "type": "res", "id": id, "ok": true, "payload": payload }).to_string()
}

async fn connection(hub: Arc<Hub>, stream: TcpStream) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let mut socket = tokio_tungstenite::accept_async(stream).await?;
    let challenge = json!({
        "type": "event", "event": "connect.challenge",
        "payload": { "nonce": uuid::Uuid::new_v4().to_string(), "ts": now_ms() },
    });
    socket.send(Message::text(challenge.to_string())).await?;
    let connect: Value = loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => break serde_json::from_str(&text)?,
            Some(Ok(Message::Close(_))) | None => return Ok(()),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
        }
    };
    let conn_id = uuid::Uuid::new_v4().to_string();
    socket
        .send(Message::text(response(&connect["id"], hello(&conn_id))))
        .await?;
    let (outbox, mut outgoing) = mpsc::unbounded_channel();
    let conn = Arc::new(Conn {
        outbox,
        seq: AtomicU64::new(0),
    });
    let id = hub.next_conn.fetch_add(1, Ordering::Relaxed);
    hub.conns.lock().unwrap().insert(id, conn.clone());
    let served = async {
        loop {
            tokio::select! {
                message = socket.next() => match message {
                    Some(Ok(Message::Text(text))) => {
                        let request: Value = serde_json::from_str(&text)?;
                        let (hub, conn, requester) = (hub.clone(), conn.clone(), conn_id.clone());
                        tokio::spawn(async move {
                            let answer = answer(&hub, &conn, &request, requester).await;
                            let _ = conn.outbox.send(answer);
                        });
                    }
                    Some(Ok(Message::Close(_))) | None => return anyhow::Ok(()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                },
                Some(frame) = outgoing.recv() => {
                    // What is queued goes out in one flush, as the edge's
                    // writer does.
                    socket.feed(Message::text(frame)).await?;
                    for _ in 1..WRITE_BATCH {
                        let Ok(frame) = outgoing.try_recv() else { break };
                        socket.feed(Message::text(frame)).await?;
                    }
                    socket.flush().await?;
                }
            }
        }
    };
    let result = served.await;
    hub.conns.lock().unwrap().remove(&id);
    result
}

/// The `hello-ok` payload, shaped as the edge's.
fn hello(conn_id: &str) -> Value {
    json!({
        "type": "hello-ok", "protocol": 4,
        "server": { "version": env!("CARGO_PKG_VERSION"), "bootId": uuid::Uuid::new_v4().to_string(), "connId": conn_id },
        "features": {
            "methods": ["health", "chat.send", "chat.abort", "chat.history", "sessions.list"],
            "events": ["connect.challenge", "agent", "chat", "presence", "tick", "health", "shutdown"],
            "capabilities": [],
        },
        "snapshot": {
            "presence": [], "health": {}, "stateVersion": { "presence": 0, "health": 0 },
            "uptimeMs": 0,
            "sessionDefaults": { "defaultAgentId": "main", "mainKey": "main", "mainSessionKey": "agent:main:main", "scope": "per-sender" },
        },
        "auth": { "method": "token", "role": "operator", "scopes": ["operator.read", "operator.write"] },
        "policy": { "maxPayload": 26_214_400, "maxBufferedBytes": 33_554_432, "tickIntervalMs": 30_000 },
    })
}

/// The `res` frame for `request`.
async fn answer(hub: &Arc<Hub>, conn: &Arc<Conn>, request: &Value, requester: String) -> String {
    let id = &request["id"];
    let params = &request["params"];
    let payload = match request["method"].as_str() {
        Some("chat.send") => {
            let run_id = params["idempotencyKey"].as_str().unwrap_or_default();
            let session = format!(
                "agent:main:{}",
                params["sessionKey"].as_str().unwrap_or("main")
            );
            let message = params["message"].as_str().unwrap_or_default();
            if let Some(coordinator) = &hub.coordinator {
                let submit = rc::SubmitRequest {
                    run_id: run_id.to_owned(),
                    session_key: session.clone(),
                    kind: "chat".into(),
                    message: message.to_owned(),
                    queue_mode: rc::QueueMode::Enqueue as i32,
                    timeout_ms: 0,
                    options_json: "{}".into(),
                    requester,
                    label: None,
                    attachments: Vec::new(),
                    expected_settings_digest: None,
                    create_session: false,
                };
                if let Err(status) = coordinator.clone().submit(submit).await {
                    return json!({
                        "type": "res", "id": id, "ok": false,
                        "error": { "code": "UNAVAILABLE", "message": status.message() },
                    })
                    .to_string();
                }
            }
            tokio::spawn(play(
                hub.clone(),
                conn.clone(),
                run_id.to_owned(),
                session,
                message.to_owned(),
            ));
            json!({ "runId": run_id, "status": "started" })
        }
        _ => json!({
            "ok": true, "ts": now_ms(), "durationMs": 0,
            "channels": {}, "channelOrder": [], "channelLabels": {},
            "heartbeatSeconds": 0, "defaultAgentId": "main",
            "agents": [{ "agentId": "main", "isDefault": true }],
            "sessions": { "path": "session-store", "count": 0, "recent": [] },
        }),
    };
    response(id, payload)
}

/// Splits `text` into at most `chunks` pieces on character boundaries, as
/// the echo runtime does.
fn split_chunks(text: &str, chunks: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(chunks.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// Plays a run back to every connection, paced as the echo runtime.
async fn play(hub: Arc<Hub>, sender: Arc<Conn>, run_id: String, session: String, message: String) {
    let started = now_ms();
    let agent = |stream: &str, data: Value, seq: u64| {
        json!({
            "runId": run_id, "sessionKey": session, "agentId": "main",
            "stream": stream, "data": data, "seq": seq, "ts": now_ms(),
        })
    };
    let chat_message = |text: &str| json!({ "role": "assistant", "content": [{ "type": "text", "text": text }], "timestamp": now_ms() });
    hub.deliver(
        &sender,
        "agent",
        &agent(
            "lifecycle",
            json!({ "phase": "start", "startedAt": started }),
            1,
        ),
    );
    let mut seq = 1;
    let mut text = String::new();
    // What is not sent yet, and when a delta last went out.
    let mut pending = String::new();
    let mut last_sent: Option<Instant> = None;
    let mut send_delta = |pending: &mut String, text: &str, last_sent: &mut Option<Instant>| {
        seq += 1;
        hub.deliver(
            &sender,
            "agent",
            &agent("assistant", json!({ "text": text, "delta": pending }), seq),
        );
        hub.deliver(
            &sender,
            "chat",
            &json!({
                "runId": run_id, "sessionKey": session, "agentId": "main", "seq": seq,
                "state": "delta", "deltaText": pending, "message": chat_message(text),
            }),
        );
        pending.clear();
        *last_sent = Some(Instant::now());
    };
    for chunk in split_chunks(&message, hub.echo.chunks) {
        let next = Instant::now() + hub.echo.pace;
        // A pending delta due before the next chunk goes out on time.
        if let Some(due) = last_sent.map(|at| at + DELTA_INTERVAL)
            && !pending.is_empty()
            && due < next
        {
            tokio::time::sleep_until(due).await;
            send_delta(&mut pending, &text, &mut last_sent);
        }
        tokio::time::sleep_until(next).await;
        pending.push_str(&chunk);
        text.push_str(&chunk);
        if last_sent.is_none_or(|at| at.elapsed() >= DELTA_INTERVAL) {
            send_delta(&mut pending, &text, &mut last_sent);
        }
    }
    if !pending.is_empty() {
        send_delta(&mut pending, &text, &mut last_sent);
    }
    seq += 1;
    let end = json!({
        "phase": "end", "startedAt": started, "endedAt": now_ms(), "aborted": false,
        "stopReason": "stop", "status": "ok",
    });
    hub.deliver(&sender, "agent", &agent("lifecycle", end, seq));
    hub.deliver(
        &sender,
        "chat",
        &json!({
            "runId": run_id, "sessionKey": session, "agentId": "main", "seq": seq,
            "state": "final", "stopReason": "stop", "message": chat_message(&text),
        }),
    );
}

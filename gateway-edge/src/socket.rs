//! One WebSocket from open to close: the challenge, the handshake under its
//! timer and size limit, then one loop that reads requests (each handled in
//! its own short task, so answers go out as they finish), writes the outbox,
//! sends ticks, and obeys close orders.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use session_store_api::store::now_ms;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::coalesce::Coalesced;
use crate::conn::{ClientInfo, CloseOrder, Conn, OutFrame, Outbox, OutboxReader};
use crate::edge::{Edge, PreauthSlot};
use crate::frames::{self, ErrorShape, FrameError, parse_request};
use crate::handshake::{self, Rejection};
use crate::preauth_io::{Guarded, PreauthGuard};

/// The socket stack: WebSocket framing over write coalescing over the
/// pre-auth guard over the upgraded HTTP connection.
pub type WebSocket = WebSocketStream<Coalesced<Guarded<TokioIo<hyper::upgrade::Upgraded>>>>;
/// Boxed, because the socket is handed from the task to the handshake to
/// the serving loop, and each async function's state would otherwise keep
/// its own copy of it (a few hundred bytes each) for the connection's life.
pub type Socket = Box<WebSocket>;
type WsError = tokio_tungstenite::tungstenite::Error;

async fn close(socket: &mut Socket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_owned().into(),
    };
    // A peer that does not read gets a few seconds, then the socket goes.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let _ = socket.send(Message::Close(Some(frame))).await;
        let _ = socket.flush().await;
    })
    .await;
}

/// Closes because of a frame over a size limit. The rest of that frame is
/// still arriving: closing with it unread would make the kernel answer with
/// a reset, and the client could lose the close frame. So after the close
/// frame the write side is shut and whatever the client still sends is read
/// and dropped, until it closes too or a few seconds pass.
async fn close_over_limit(socket: &mut Socket, code: u16, reason: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    close(socket, code, reason).await;
    let io = socket.get_mut();
    let _ = io.shutdown().await;
    let mut sink = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

async fn send_text(socket: &mut Socket, text: String, frame_bytes: usize) -> bool {
    write_text(socket, text, frame_bytes).await.is_ok()
}

/// Writes one text message, as frames of at most `frame_bytes` of payload
/// (a first `Text` frame, then `Continue` frames, split at character
/// boundaries). The WebSocket library stages every frame it writes in a
/// buffer that keeps its largest size, so an idle connection would hold the
/// largest message it was ever sent (a `hello-ok` with its presence list,
/// a history page); fragmenting bounds that buffer by `frame_bytes`.
async fn write_text(socket: &mut Socket, text: String, frame_bytes: usize) -> Result<(), WsError> {
    feed_text(socket, text, frame_bytes).await?;
    socket.flush().await
}

/// Frames of a batch are written together, up to this many.
const WRITE_BATCH: usize = 64;

/// Writes `first` and what else is queued already (up to `WRITE_BATCH`
/// frames), flushing once: a fan-out queues several events at once (a run's
/// `agent` and `chat` event), and each write is a system call. Returns the
/// outcome and the bytes taken from the outbox.
async fn write_batch(
    socket: &mut Socket,
    first: OutFrame,
    queued: &mut OutboxReader,
    frame_bytes: usize,
) -> (Result<(), WsError>, usize) {
    let (mut next, mut bytes, mut count) = (Some(first), 0, 0);
    while let Some(frame) = next.take() {
        bytes += frame.wire_len();
        if let Err(err) = feed_text(socket, frame.into_text(), frame_bytes).await {
            return (Err(err), bytes);
        }
        count += 1;
        if count < WRITE_BATCH {
            next = queued.try_recv();
        }
    }
    (socket.flush().await, bytes)
}

/// `write_text` without the flush: the frames reach the socket once the
/// library's write buffer is full or flushed.
async fn feed_text(socket: &mut Socket, text: String, frame_bytes: usize) -> Result<(), WsError> {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    if text.len() <= frame_bytes {
        return socket.feed(Message::text(text)).await;
    }
    let bytes = tokio_tungstenite::tungstenite::Bytes::from(text);
    let mut start = 0;
    while start < bytes.len() {
        let mut end = (start + frame_bytes.max(4)).min(bytes.len());
        // A fragment ends on a character boundary (UTF-8 continuation
        // bytes are 0b10xx_xxxx), so each one is valid text by itself.
        while end < bytes.len() && (bytes[end] & 0xC0) == 0x80 {
            end -= 1;
        }
        let opcode = if start == 0 {
            Data::Text
        } else {
            Data::Continue
        };
        let last = end == bytes.len();
        let frame = Frame::message(bytes.slice(start..end), OpCode::Data(opcode), last);
        socket.feed(Message::Frame(frame)).await?;
        start = end;
    }
    Ok(())
}

/// The text of a data frame (binary is read as UTF-8; binary that is not
/// is empty text, so it is ignored like any frame that is not JSON) with
/// the frame's size in bytes, or why there is none.
enum Incoming {
    Text(String, usize),
    /// A frame over the socket's size limit (`policy.maxPayload`).
    TooLarge,
    /// A text message that is not UTF-8: closed 1007, as RFC 6455 (and the
    /// OpenClaw gateway's WebSocket library) has it.
    NotUtf8,
    Closed,
    Ignore,
}

fn incoming(message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>) -> Incoming {
    match message {
        Some(Ok(Message::Text(text))) => Incoming::Text(text.to_string(), text.len()),
        Some(Ok(Message::Binary(bytes))) => Incoming::Text(
            String::from_utf8(bytes.to_vec()).unwrap_or_default(),
            bytes.len(),
        ),
        Some(Err(tokio_tungstenite::tungstenite::Error::Utf8(_))) => Incoming::NotUtf8,
        Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(_))) => Incoming::TooLarge,
        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => Incoming::Closed,
        Some(Ok(_)) => Incoming::Ignore,
    }
}

/// Where a socket comes from, as the upgrade request told.
pub struct Peer {
    /// The socket's peer address.
    pub socket: SocketAddr,
    /// The client's address (the peer, or behind a trusted proxy the
    /// address it forwards for): what per-IP limits count.
    pub ip: IpAddr,
    /// A browser Origin that is not allowed: the handshake refuses it.
    pub origin: Option<String>,
}

pub async fn run(
    edge: Arc<Edge>,
    socket: Socket,
    peer: Peer,
    slot: PreauthSlot,
    guard: Arc<PreauthGuard>,
) {
    // The handshake's state lives in an allocation of its own, freed once
    // it is over: the connection's task then holds only what serving it
    // needs, for as long as the connection stays open.
    let Some((socket, conn, reader)) = Box::pin(handshake(&edge, socket, &peer, &guard)).await
    else {
        return;
    };
    guard.authenticated();
    slot.release();
    serve_connection(edge, socket, conn, reader, &guard).await;
}

/// The challenge and `connect`: the connection registered and hello-ok
/// sent, or `None` when the socket was closed (as the protocol says).
async fn handshake(
    edge: &Arc<Edge>,
    mut socket: Socket,
    peer: &Peer,
    guard: &PreauthGuard,
) -> Option<(Socket, Arc<Conn>, OutboxReader)> {
    let nonce = uuid::Uuid::new_v4().to_string();
    let challenge = json!({ "nonce": nonce, "ts": now_ms() });
    let frame_bytes = edge.config.socket_frame_bytes;
    if !send_text(
        &mut socket,
        frames::event("connect.challenge", &challenge, None),
        frame_bytes,
    )
    .await
    {
        return None;
    }
    let deadline = tokio::time::Instant::now() + edge.config.handshake_timeout;
    let (first, first_size) = loop {
        let message = tokio::select! {
            message = socket.next() => message,
            () = tokio::time::sleep_until(deadline) => {
                // The protocol closes a stalled handshake with 1000, no reason.
                close(&mut socket, 1000, "").await;
                return None;
            }
        };
        match incoming(message) {
            Incoming::Text(text, size) => break (text, size),
            Incoming::TooLarge => {
                close_over_limit(&mut socket, 1009, "preauth payload too large").await;
                return None;
            }
            Incoming::Closed if guard.exceeded() => {
                close_over_limit(&mut socket, 1009, "preauth payload too large").await;
                return None;
            }
            Incoming::NotUtf8 => {
                close(&mut socket, 1007, NOT_UTF8).await;
                return None;
            }
            Incoming::Closed => return None,
            Incoming::Ignore => continue,
        }
    };
    if first_size > edge.config.preauth_max_bytes {
        close(&mut socket, 1009, "preauth payload too large").await;
        return None;
    }
    if crate::json_depth::nests_deeper_than(&first, edge.config.max_json_depth) {
        close(&mut socket, 1008, "invalid request frame").await;
        return None;
    }
    let request = match parse_request(&first) {
        Ok(request) => request,
        Err(FrameError::NotJson) => {
            close(&mut socket, 1000, "").await;
            return None;
        }
        Err(FrameError::Invalid { .. }) => {
            close(&mut socket, 1008, "invalid request frame").await;
            return None;
        }
    };
    let (conn, reader) = match accept_connect(edge, &request, &nonce, peer) {
        Ok((conn, reader, mut hello)) => {
            // Registered before hello-ok leaves, so every run event from the
            // moment the client learns it is connected reaches it; events
            // queue in the outbox, which is written only after hello-ok.
            edge.register(conn.clone());
            crate::presence::connected(edge);
            hello["snapshot"]["presence"] = json!(crate::presence::list(edge));
            hello["snapshot"]["stateVersion"]["presence"] = json!(
                edge.presence_version
                    .load(std::sync::atomic::Ordering::Relaxed)
            );
            let hello = frames::ok_response(&request.id, hello);
            if !send_text(&mut socket, hello, frame_bytes).await {
                edge.unregister(conn.id);
                return None;
            }
            (conn, reader)
        }
        Err(rejection) => {
            let _ = send_text(
                &mut socket,
                frames::error_response(&request.id, &rejection.error, None),
                frame_bytes,
            )
            .await;
            close(&mut socket, rejection.close_code, &rejection.close_reason).await;
            return None;
        }
    };
    Some((socket, conn, reader))
}

/// The close reason for a message that is not UTF-8.
const NOT_UTF8: &str = "invalid UTF-8";

/// Optional protocol features this edge implements (`features.capabilities`).
/// None of the real gateway's 21 yet: each gates a client path (published
/// model catalogs, session settings contracts, routing contracts, node
/// workers) whose methods this edge does not serve, and announcing one
/// would send clients down it.
const CAPABILITIES: &[&str] = &[];

/// Runs the handshake checks in the protocol's order and builds `hello-ok`.
fn accept_connect(
    edge: &Arc<Edge>,
    request: &frames::Request,
    nonce: &str,
    peer: &Peer,
) -> Result<(Arc<Conn>, OutboxReader, Value), Rejection> {
    if request.method != "connect" {
        return Err(Rejection::policy(ErrorShape::invalid(
            "invalid handshake: first request must be connect",
        )));
    }
    let params = handshake::parse_connect(&request.params)?;
    let protocol = handshake::negotiate(&params)?;
    handshake::check_role(&params)?;
    if let Some(origin) = &peer.origin {
        return Err(handshake::origin_refused(origin));
    }
    let auth_method = edge.authenticate(&params, peer.ip)?;
    let device = crate::identity::verify(edge, &params, nonce)?;
    let scopes = handshake::effective_scopes(&params, device.is_some());
    let conn_id = uuid::Uuid::new_v4().to_string();
    let (outbox, reader) = Outbox::new(edge.config.max_buffered_bytes, edge.metrics.clone());
    let mut auth = json!({ "method": auth_method, "role": params.role, "scopes": scopes });
    if let Some(device) = &device {
        auth["deviceToken"] = json!(device.token);
        auth["issuedAtMs"] = json!(device.issued_at_ms);
    }
    let conn = Arc::new(Conn {
        id: edge.next_conn_id(),
        requester: device
            .as_ref()
            .map_or_else(|| conn_id.clone(), |d| d.device_id.clone()),
        conn_id: conn_id.clone(),
        role: params.role.clone(),
        scopes,
        tool_events: params.caps.iter().any(|c| c == "tool-events"),
        outbox,
        sessions_subscribed: AtomicBool::new(false),
        runs: Default::default(),
        client: ClientInfo {
            id: params.client_id.clone(),
            mode: params.client_mode.clone(),
            version: params.client_version.clone(),
            platform: params.platform.clone(),
            device_family: params.device_family.clone(),
            display_name: params.display_name.clone(),
            instance_id: params.instance_id.clone(),
            ip: peer.ip.to_string(),
            connected_at_ms: now_ms(),
        },
        message_watch: Default::default(),
        requests: Default::default(),
    });
    let hello = json!({
        "type": "hello-ok",
        "protocol": protocol,
        "server": { "version": edge.version, "bootId": edge.boot_id, "connId": conn_id },
        "features": {
            "methods": crate::methods::advertised_methods(),
            "events": crate::fanout::SERVED_EVENTS,
            "capabilities": CAPABILITIES,
        },
        "snapshot": {
            // Filled once the connection is registered (`run`), so it is listed.
            "presence": [],
            "health": {},
            "stateVersion": { "presence": 0, "health": 0 },
            "uptimeMs": edge.started.elapsed().as_millis() as u64,
            "sessionDefaults": {
                "defaultAgentId": "main",
                "mainKey": "main",
                "mainSessionKey": "agent:main:main",
                "scope": "per-sender",
            },
        },
        "auth": auth,
        "policy": {
            "maxPayload": edge.config.max_payload,
            "maxBufferedBytes": edge.config.max_buffered_bytes,
            "tickIntervalMs": edge.config.tick_interval.as_millis() as u64,
            "attachments": {
                "maxBytes": edge.config.attachment_max_bytes,
                "maxImageBytes": edge.config.attachment_max_bytes,
            },
        },
    });
    Ok((conn, reader, hello))
}

/// Writes what the outbox holds, for a few seconds at most (a peer that
/// does not read gets no longer).
async fn flush_queued(socket: &mut Socket, reader: &mut OutboxReader, frame_bytes: usize) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(frame) = reader.try_recv() {
            let _ = write_batch(socket, frame, reader, frame_bytes).await;
        }
    })
    .await;
}

/// Sleeps until `until` (only polled while it is set).
async fn linger(until: Option<tokio::time::Instant>) {
    if let Some(until) = until {
        tokio::time::sleep_until(until).await;
    }
}

/// The authenticated connection until it closes.
async fn serve_connection(
    edge: Arc<Edge>,
    mut socket: Socket,
    conn: Arc<Conn>,
    mut reader: OutboxReader,
    guard: &PreauthGuard,
) {
    let mut ticks = tokio::time::interval(edge.config.tick_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    // A frame over the limit is still arriving when the socket closes.
    let mut over_limit = false;
    let frame_bytes = edge.config.socket_frame_bytes;
    // After a write, queued events wait until this instant (`--event-linger`),
    // unless an answer is queued: a fan-out's events to this connection then
    // go out together.
    let linger_for = edge.config.event_linger;
    let mut hold_until: Option<tokio::time::Instant> = None;
    // Made once, not per wakeup: a cancellation future registers with its
    // token when first polled, and re-making it on every turn of the loop
    // (every batch of a busy fan-out) was a lock and a registration each.
    let closing = conn.outbox.closing.cancelled();
    let shutdown = edge.shutdown.cancelled();
    tokio::pin!(closing, shutdown);
    // Requests are read before queued events are written: under a heavy
    // fan-out the outbox is rarely empty, and a request read only once it
    // is (a `chat.send` waiting behind other runs' events) would spend its
    // sync-phase budget there. A peer that floods requests delays only its
    // own events (and its outbox's byte budget still bounds them).
    let order = loop {
        tokio::select! {
            biased;
            () = &mut closing => {
                let order = conn.outbox.close_order();
                // What was answered before the order still goes out (the
                // flood guard's last refusal), unless the peer not reading
                // is why it closes.
                if order.as_ref().is_some_and(CloseOrder::flushes_queued) {
                    flush_queued(&mut socket, &mut reader, frame_bytes).await;
                }
                break order;
            }
            () = &mut shutdown => {
                let payload = json!({ "reason": "service restart", "restartExpectedMs": 0 });
                conn.outbox.broadcast("shutdown", &payload, false);
                // Flush what is queued, including the shutdown event.
                flush_queued(&mut socket, &mut reader, frame_bytes).await;
                break Some(CloseOrder { code: 1012, reason: "service restart".into() });
            }
            message = socket.next() => match incoming(message) {
                Incoming::Text(text, _) => crate::methods::dispatch(&edge, &conn, &text),
                Incoming::TooLarge => {
                    over_limit = true;
                    // As the WebSocket library of the OpenClaw gateway words it.
                    break Some(CloseOrder { code: 1009, reason: "Max payload size exceeded".into() });
                }
                Incoming::NotUtf8 => break Some(CloseOrder { code: 1007, reason: NOT_UTF8.into() }),
                Incoming::Closed => break None,
                Incoming::Ignore => {}
            },
            () = linger(hold_until), if hold_until.is_some() => hold_until = None,
            () = conn.outbox.answered.notified(), if hold_until.is_some() => hold_until = None,
            frame = reader.recv(), if hold_until.is_none() => {
                let Some(frame) = frame else { break None };
                // A peer that stops reading blocks this write; a close order
                // (slow consumer, shutdown) must still get through.
                let (sent, bytes) = tokio::select! {
                    sent = write_batch(&mut socket, frame, &mut reader, frame_bytes) => sent,
                    () = &mut closing => break conn.outbox.close_order(),
                    () = &mut shutdown => break Some(CloseOrder { code: 1012, reason: "service restart".into() }),
                };
                conn.outbox.written(bytes);
                if sent.is_err() {
                    break None;
                }
                if !linger_for.is_zero() {
                    hold_until = Some(tokio::time::Instant::now() + linger_for);
                }
            }
            _ = ticks.tick() => {
                let now = tokio::time::Instant::now();
                // A message half-read for longer than the frame timeout ends
                // the socket (checked each tick, so up to a tick late).
                if guard.unfinished_for(now).is_some_and(|took| took > edge.config.frame_timeout) {
                    over_limit = true;
                    break Some(CloseOrder { code: 1008, reason: "frame timeout".into() });
                }
                conn.outbox.broadcast("tick", &json!({ "ts": now_ms() }), false);
            }
        }
    };
    edge.unregister(conn.id);
    crate::presence::broadcast(&edge);
    conn.outbox.closing.cancel();
    if let Some(order) = order {
        if over_limit {
            close_over_limit(&mut socket, order.code, &order.reason).await;
        } else {
            close(&mut socket, order.code, &order.reason).await;
        }
    } else {
        let _ = WebSocket::close(&mut socket, None).await;
    }
}

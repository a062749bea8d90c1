//! One WebSocket from open to close: the challenge and the handshake
//! (`connect.rs`), then one loop that reads requests (each handled in its
//! own short task, so answers go out as they finish), writes the outbox,
//! sends ticks, and obeys close orders.

use std::sync::Arc;

use clawgate_common::clock::now_ms;
use serde_json::json;

use super::connect::{Peer, handshake};
use super::park::Link;
use super::preauth_io::PreauthGuard;
use super::wire::{
    Incoming, NOT_UTF8, Socket, WebSocket, close, close_over_limit, flush_queued, incoming,
    write_batch,
};
use crate::events::{Events, presence};
use crate::methods::dispatch;
use crate::state::Edge;
use crate::state::connection::{CloseOrder, Conn, OutboxReader};
use crate::state::limits::PreauthSlot;

pub async fn run(
    edge: Arc<Edge>,
    events: Arc<Events>,
    socket: Socket,
    peer: Peer,
    slot: PreauthSlot,
    guard: Arc<PreauthGuard>,
) {
    // The handshake's state lives in an allocation of its own, freed once
    // it is over: the connection's task then holds only what serving it
    // needs, for as long as the connection stays open.
    let Some((socket, conn, reader)) =
        Box::pin(handshake(&edge, &events, socket, &peer, &guard)).await
    else {
        return;
    };
    guard.authenticated();
    drop(slot);
    serve_connection(edge, events, socket, conn, reader, &guard).await;
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
    events: Arc<Events>,
    socket: Socket,
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
    // Between messages the WebSocket library's buffers are dropped (`park`).
    let mut link = Link::new(socket, edge.config.max_payload);
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
                    flush_queued(link.socket().await, &mut reader, frame_bytes).await;
                }
                break order;
            }
            () = &mut shutdown => {
                let payload = json!({ "reason": "service restart", "restartExpectedMs": 0 });
                conn.outbox.broadcast("shutdown", &payload, false);
                // Flush what is queued, including the shutdown event.
                flush_queued(link.socket().await, &mut reader, frame_bytes).await;
                break Some(CloseOrder { code: 1012, reason: "service restart".into() });
            }
            message = link.next(guard) => match incoming(message) {
                Incoming::Text(text, _) => dispatch(&edge, &events, &conn, &text),
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
                let socket = link.socket().await;
                let (sent, bytes) = tokio::select! {
                    sent = write_batch(socket, frame, &mut reader, frame_bytes) => sent,
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
    if conn.requester == conn.conn_id {
        // Without a device the connection was its own user: no later
        // connection can read these preferences.
        edge.user_prefs.forget(&conn.requester);
    }
    presence::broadcast(&edge, &events);
    conn.outbox.closing.cancel();
    let socket = link.socket().await;
    if let Some(order) = order {
        if over_limit {
            close_over_limit(socket, order.code, &order.reason).await;
        } else {
            close(socket, order.code, &order.reason).await;
        }
    } else {
        let _ = WebSocket::close(socket, None).await;
    }
}

//! The start of a socket's life: the `connect.challenge` event, the first
//! request under the handshake's timer and size limit, the checks in the
//! protocol's order (`auth/`), and `hello-ok`, with the connection
//! registered before it leaves.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clawgate_common::clock::now_ms;
use futures::StreamExt;
use serde_json::{Value, json};

use super::preauth_io::PreauthGuard;
use super::wire::{Incoming, NOT_UTF8, Socket, close, close_over_limit, incoming, send_text};
use crate::auth::handshake::{self, Rejection};
use crate::auth::identity;
use crate::events::Events;
use crate::events::fanout::SERVED_EVENTS;
use crate::events::presence;
use crate::methods::advertised_methods;
use crate::protocol::frames::{self, ErrorShape, FrameError, parse_request};
use crate::protocol::json_depth::nests_deeper_than;
use crate::state::Edge;
use crate::state::connection::{ClientInfo, Conn, Outbox, OutboxReader};

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

/// The challenge and `connect`: the connection registered and hello-ok
/// sent, or `None` when the socket was closed (as the protocol says).
pub async fn handshake(
    edge: &Arc<Edge>,
    events: &Arc<Events>,
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
    if nests_deeper_than(&first, edge.config.max_json_depth) {
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
            events.presence.connected();
            hello["snapshot"]["presence"] = json!(presence::list_for(edge, &conn));
            hello["snapshot"]["stateVersion"]["presence"] = json!(events.presence.version());
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
    let auth_method = edge.auth.authenticate(&params, peer.ip)?;
    let device = identity::verify(&edge.auth.device_tokens, &params, nonce)?;
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
            "methods": advertised_methods(),
            "events": SERVED_EVENTS,
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

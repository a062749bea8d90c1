//! `serve(config, listener, shutdown)`: the HTTP listener. Plain GETs of
//! `/healthz`, `/readyz` and `/metrics` are answered over HTTP, any other
//! path from the Control UI directory when one is configured
//! (`control_ui.rs`); an upgrade on any path
//! becomes a gateway WebSocket, within a per-IP budget of unauthenticated
//! sockets (503 over it) and a connection cap.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::coalesce::Coalesced;
use crate::config::EdgeConfig;
use crate::edge::{Backends, Edge};
use crate::preauth_io::{Guarded, PreauthGuard};

type Body = Full<Bytes>;

fn plain(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

fn is_websocket_upgrade(req: &Request<Incoming>) -> bool {
    let has = |name, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(UPGRADE, "websocket") && has(CONNECTION, "upgrade")
}

/// Small buffers keep an idle connection cheap: the library's write buffer
/// keeps its largest size, which stays near this because no frame is longer
/// than `--socket-frame-bytes`. What it writes is gathered beneath it
/// (`coalesce::Coalesced`) into one system call per batch of frames.
pub fn websocket_config(max_payload: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(2048)
        .max_message_size(Some(max_payload))
        .max_frame_size(Some(max_payload))
}

async fn route(
    edge: Arc<Edge>,
    registry: Arc<Registry>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if !is_websocket_upgrade(&req) {
        let path = req.uri().path();
        let reserved = ["/healthz", "/readyz", "/metrics"].contains(&path);
        if let (Some(ui), false) = (&edge.control_ui, reserved) {
            return Ok(ui.respond(req.method(), path).await);
        }
        return Ok(match path {
            "/healthz" => plain(StatusCode::OK, "ok\n"),
            "/metrics" => clawgate_telemetry::metrics::response(&registry),
            "/readyz" if edge.shutdown.is_cancelled() => {
                plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            }
            "/readyz" if !edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the coordinator event stream\n",
            ),
            "/readyz" => plain(StatusCode::OK, "ready\n"),
            _ => plain(StatusCode::NOT_FOUND, "not found\n"),
        });
    }
    if edge.connection_count() >= edge.config.max_connections || edge.shutdown.is_cancelled() {
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "Too many connections",
        ));
    }
    let headers = req.headers();
    let client = crate::peer::client_ip(peer.ip(), headers, &edge.config.trusted_proxies);
    let origin = headers
        .get(hyper::header::ORIGIN)
        .map(|o| String::from_utf8_lossy(o.as_bytes()).into_owned());
    let host = headers
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok());
    let origin_allowed =
        crate::peer::origin_allowed(origin.as_deref(), host, &edge.config.allowed_origins);
    let peer = crate::socket::Peer {
        socket: peer,
        ip: client,
        origin: origin.filter(|_| !origin_allowed),
    };
    let Some(slot) = edge.take_preauth_slot(peer.ip) else {
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "Too many unauthenticated sockets",
        ));
    };
    let Some(key) = req
        .headers()
        .get(SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
    else {
        return Ok(plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key"));
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                edge.metrics.connection_accepted();
                let config = websocket_config(edge.config.max_payload);
                let guard = PreauthGuard::new(edge.config.preauth_max_bytes);
                let io = Guarded::new(TokioIo::new(upgraded), guard.clone());
                let io = Coalesced::new(io, edge.config.socket_write_coalesce_bytes);
                let socket = Box::new(
                    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await,
                );
                crate::socket::run(edge, socket, peer, slot, guard).await;
            }
            Err(err) => {
                tracing::debug!(peer = %peer.socket, error = %err, "websocket upgrade failed")
            }
        }
    });
    let mut response = plain(StatusCode::SWITCHING_PROTOCOLS, "");
    let headers = response.headers_mut();
    headers.insert(UPGRADE, "websocket".parse().expect("static header"));
    headers.insert(CONNECTION, "Upgrade".parse().expect("static header"));
    headers.insert(
        SEC_WEBSOCKET_ACCEPT,
        key.parse().expect("base64 is a valid header"),
    );
    Ok(response)
}

/// Serves the edge until `shutdown`: then every connection gets the
/// `shutdown` event and is closed 1012.
pub async fn serve(
    config: EdgeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.check()?;
    let backends = Backends::connect_lazy(&config)?;
    let edge = Edge::new(config, backends);
    serve_edge(edge, listener, shutdown).await
}

pub async fn serve_edge(
    edge: Arc<Edge>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let fanout = tokio::spawn(crate::fanout::run(edge.clone()));
    let health = tokio::spawn(crate::methods::broadcast_health(
        edge.clone(),
        edge.config.health_interval,
    ));
    let registry = {
        let mut registry = clawgate_telemetry::metrics::service_registry();
        edge.metrics.register(&mut registry);
        Arc::new(registry)
    };
    tracing::info!(address = %listener.local_addr()?, "gateway edge listening");
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let _ =
            socket2::SockRef::from(&stream).set_send_buffer_size(edge.config.socket_send_buffer);
        let (edge, registry) = (edge.clone(), registry.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| route(edge.clone(), registry.clone(), peer, req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
    tracing::info!("gateway edge shutting down");
    edge.shutdown.cancel();
    // Connections send `shutdown` and close 1012 on their own; give them a moment.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while edge.connection_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    fanout.abort();
    health.abort();
    Ok(())
}

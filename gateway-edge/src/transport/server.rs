//! `serve(config, listener, shutdown)`: the HTTP listener (and, on a listen
//! address of its own unless `--metrics-on-public-port`, `/metrics`). Every accepted
//! socket is first counted against the socket caps (`admission.rs`: 503
//! and closed over them) and given the head and idle timeouts. Plain GETs
//! of `/healthz`, `/readyz` and `/metrics` are answered over HTTP, any
//! other path from the Control UI directory when one is configured
//! (`control_ui.rs`); an upgrade on any path becomes a gateway WebSocket,
//! within a per-IP and a global budget of unauthenticated sockets (503
//! over them) and the connection cap (`--max-connections`: a permit per
//! WebSocket, taken before the upgrade is answered and held by its task
//! until the socket is gone). A failed accept backs off (5 ms doubling to
//! 1 s) and is logged at most once a second.
//!
//! Every task the listener starts (an HTTP connection, a WebSocket) is
//! tracked: at shutdown the listener stops accepting, every WebSocket gets
//! the `shutdown` event and closes 1012, plain HTTP connections finish
//! their request, and the listener waits for all of them, at most
//! [`SHUTDOWN_GRACE`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clawgate_telemetry::accept::AcceptBackoff;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::task::TaskTracker;

use super::admission::{Activity, SocketCaps, SocketSlot, Watched, idle, refuse};
use super::coalesce::Coalesced;
use super::connect::Peer;
use super::control_ui::ControlUi;
use super::peer::{client_ip, local_only, origin_allowed};
use super::preauth_io::{Guarded, PreauthGuard};
use crate::config::{AuthMode, EdgeConfig};
use crate::events::{Events, fanin};
use crate::methods::broadcast_health;
use crate::state::limits::Refusal;
use crate::state::{Backends, Edge};

type Body = Full<Bytes>;

/// How long shutdown waits for connections to close on their own.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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

/// The WebSocket library's read buffer, bytes (an idle connection holds
/// none: `park`).
pub const READ_BUFFER_BYTES: usize = 1024;

/// Small buffers keep an idle connection cheap: the library's write buffer
/// keeps its largest size, which stays near this because no frame is longer
/// than `--socket-frame-bytes`. What it writes is gathered beneath it
/// (`coalesce::Coalesced`) into one system call per batch of frames.
pub fn websocket_config(max_payload: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(2048)
        .max_message_size(Some(max_payload))
        .max_frame_size(Some(max_payload))
}

/// What the listener's tasks share.
struct Listener {
    edge: Arc<Edge>,
    events: Arc<Events>,
    /// The metrics, when `/metrics` is served on the public port.
    registry: Option<Arc<Registry>>,
    control_ui: Option<ControlUi>,
    /// One permit per WebSocket (`--max-connections`).
    connections: Arc<Semaphore>,
    /// Every open socket's place (`--max-sockets`, `--sockets-per-ip`).
    sockets: SocketCaps,
    tasks: TaskTracker,
}

impl Listener {
    /// A plain HTTP request: probes, metrics, the Control UI's files.
    async fn respond(&self, req: &Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        let reserved = ["/healthz", "/readyz", "/metrics"].contains(&path);
        if let (Some(ui), false) = (&self.control_ui, reserved) {
            return ui.respond(req.method(), path).await;
        }
        let edge = &self.edge;
        match path {
            "/healthz" => plain(StatusCode::OK, "ok\n"),
            "/metrics" if self.registry.is_some() => {
                clawgate_telemetry::metrics::response(self.registry.as_deref().expect("checked"))
            }
            "/readyz" if edge.shutdown.is_cancelled() => {
                plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            }
            "/readyz" if !edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the coordinator event stream\n",
            ),
            "/readyz" => plain(StatusCode::OK, "ready\n"),
            _ => plain(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    async fn route(
        self: Arc<Self>,
        peer: SocketAddr,
        slot: Arc<SocketSlot>,
        mut req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let edge = &self.edge;
        let config = &edge.config;
        let headers = req.headers();
        let client = client_ip(
            peer.ip(),
            headers,
            &config.trusted_proxies,
            config.forwarded_header,
        );
        if config.auth_mode == AuthMode::None || config.listen.ip().is_loopback() {
            let host = headers
                .get(hyper::header::HOST)
                .and_then(|h| h.to_str().ok());
            let no_auth = config.auth_mode == AuthMode::None;
            if let Err(refused) =
                local_only(no_auth, peer.ip(), client, host, &config.allowed_hosts)
            {
                return Ok(plain(StatusCode::FORBIDDEN, refused.message()));
            }
        }
        if !is_websocket_upgrade(&req) {
            return Ok(self.respond(&req).await);
        }
        let permit = match self.connections.clone().try_acquire_owned() {
            Ok(permit) if !edge.shutdown.is_cancelled() => permit,
            _ => {
                return Ok(plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Too many connections",
                ));
            }
        };
        let headers = req.headers();
        let origin = headers
            .get(hyper::header::ORIGIN)
            .map(|o| String::from_utf8_lossy(o.as_bytes()).into_owned());
        let host = headers
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok());
        let allowed = origin_allowed(origin.as_deref(), host, &edge.config.allowed_origins);
        let peer = Peer {
            socket: peer,
            ip: client,
            origin: origin.filter(|_| !allowed),
        };
        let preauth = match edge.preauth.take(peer.ip) {
            Ok(preauth) => preauth,
            Err(refusal) => {
                edge.metrics.socket_refused("upgrade", refusal.label());
                let body = match refusal {
                    Refusal::PerAddress => "Too many unauthenticated sockets",
                    Refusal::Total => "Too many unauthenticated sockets on this gateway",
                };
                return Ok(plain(StatusCode::SERVICE_UNAVAILABLE, body));
            }
        };
        let Some(key) = req
            .headers()
            .get(SEC_WEBSOCKET_KEY)
            .map(|k| derive_accept_key(k.as_bytes()))
        else {
            return Ok(plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key"));
        };
        let upgrade = hyper::upgrade::on(&mut req);
        let (edge, events) = (edge.clone(), self.events.clone());
        self.tasks.spawn(async move {
            // Held for the socket's whole life: its slots in the caps.
            let _permit: OwnedSemaphorePermit = permit;
            let _slot = slot;
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
                    super::socket::run(edge, events, socket, peer, preauth, guard).await;
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

    /// One accepted socket's HTTP connection, until it closes (or is
    /// upgraded), is idle for `--http-idle-timeout`, or until shutdown lets
    /// its request in progress finish. `slot` is the socket's place in the
    /// caps; an upgrade's task holds it on.
    async fn serve_http(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, slot: SocketSlot) {
        let slot = Arc::new(slot);
        let listener = self.clone();
        let service = service_fn(move |req| listener.clone().route(peer, slot.clone(), req));
        let config = &self.edge.config;
        let activity = Activity::default();
        let io = TokioIo::new(Watched::new(stream, activity.clone()));
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout)
            .serve_connection(io, service)
            .with_upgrades();
        tokio::pin!(connection);
        let idle = idle(&activity, config.http_idle_timeout);
        tokio::pin!(idle);
        tokio::select! {
            _ = connection.as_mut() => return,
            // Dropping the connection closes the socket.
            () = &mut idle => return,
            () = self.edge.shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
        }
        tokio::select! {
            _ = connection => {}
            () = idle => {}
        }
    }
}

/// Serves the edge until `shutdown`: then every connection gets the
/// `shutdown` event and is closed 1012.
pub async fn serve(
    config: EdgeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with_metrics(config, listener, None, shutdown).await
}

/// [`serve`] with `/metrics` on `metrics_listener` (bound already, by the
/// all-in-one); `None`: on `--metrics-listen`.
pub async fn serve_with_metrics(
    config: EdgeConfig,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.check()?;
    let backends = Backends::connect_lazy(&config)?;
    let edge = Edge::new(config, backends);
    serve_all(edge, Arc::default(), listener, metrics_listener, shutdown).await
}

/// [`serve`] with an edge already made (its state stays the caller's).
pub async fn serve_edge(
    edge: Arc<Edge>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with_events(edge, Arc::default(), listener, shutdown).await
}

/// [`serve_edge`] with the event machinery's state the caller's too.
pub async fn serve_with_events(
    edge: Arc<Edge>,
    events: Arc<Events>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_all(edge, events, listener, None, shutdown).await
}

async fn serve_all(
    edge: Arc<Edge>,
    events: Arc<Events>,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let control_ui = edge.config.control_ui_root()?.map(ControlUi::new);
    let mut registry = clawgate_telemetry::metrics::service_registry();
    edge.metrics.register(&mut registry);
    let registry = Arc::new(registry);
    // Stopped when dropped, as this returns.
    let _metrics_server = if edge.config.metrics_on_public_port {
        None
    } else {
        let metrics_listener = match metrics_listener {
            Some(bound) => bound,
            None => TcpListener::bind(edge.config.metrics_listen).await?,
        };
        Some(clawgate_telemetry::metrics::spawn_metrics_server(
            metrics_listener,
            registry.clone(),
        ))
    };
    let registry = edge.config.metrics_on_public_port.then_some(registry);
    let shared = Arc::new(Listener {
        connections: Arc::new(Semaphore::new(edge.config.max_connections)),
        sockets: SocketCaps::new(&edge.config, edge.metrics.clone()),
        edge: edge.clone(),
        events: events.clone(),
        registry,
        control_ui,
        tasks: TaskTracker::new(),
    });
    let fanin = tokio::spawn(fanin::run(edge.clone(), events));
    let health = tokio::spawn(broadcast_health(edge.clone(), edge.config.health_interval));
    tracing::info!(
        address = %listener.local_addr()?,
        max_sockets = shared.sockets.cap(),
        "gateway edge listening"
    );
    tokio::pin!(shutdown);
    let mut backoff = AcceptBackoff::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    edge.metrics.accept_failed();
                    let pause = backoff.failed("gateway edge", &err);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
            },
        };
        backoff.accepted();
        let slot = match shared.sockets.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(refusal) => {
                edge.metrics.socket_refused("accept", refusal.label());
                refuse(stream, refusal);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ =
            socket2::SockRef::from(&stream).set_send_buffer_size(edge.config.socket_send_buffer);
        shared
            .tasks
            .spawn(shared.clone().serve_http(stream, peer, slot));
    }
    tracing::info!("gateway edge shutting down");
    drop(listener);
    edge.shutdown.cancel();
    // Connections send `shutdown` and close 1012 on their own.
    shared.tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, shared.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            left = shared.tasks.len(),
            "connections still open after the shutdown grace"
        );
    }
    fanin.abort();
    health.abort();
    Ok(())
}

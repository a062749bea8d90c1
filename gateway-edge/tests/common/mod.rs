//! The whole system in one test process: a session-store gRPC server
//! (embedded file), a run-coordinator gRPC server with a stub runtime, and
//! any number of gateway edges in front; plus a small WebSocket client.
#![allow(dead_code)]

pub mod captures;
pub mod events;
pub mod split;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use gateway_edge::config::EdgeConfig;
use gateway_edge::edge::{Backends, Edge};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::runtime::{AgentRuntime, RuntimeError, RuntimeRequest, RuntimeStream};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "testtoken";

/// Like the stub model of the captures: messages with `SLOW` stream 20
/// pieces slowly, with `TOOL` call a tool first, others answer at once;
/// the text is the message echoed.
pub struct StubRuntime {
    echo: EchoRuntime,
}

impl StubRuntime {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            echo: EchoRuntime::new(EchoConfig::default()),
        })
    }
}

#[async_trait]
impl AgentRuntime for StubRuntime {
    fn name(&self) -> &'static str {
        "stub"
    }

    async fn execute(
        &self,
        mut request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        request.options = if request.message.contains("SLOW") {
            json!({ "chunks": 20, "paceMs": 300 })
        } else if request.message.contains("FLOOD") {
            json!({ "chunks": 50, "paceMs": 20 })
        } else if request.message.contains("TOOL") {
            json!({ "chunks": 2, "paceMs": 5, "toolCall": true })
        } else {
            json!({ "chunks": 2, "paceMs": 5 })
        };
        self.echo.execute(request, cancel).await
    }
}

/// A runtime the test drives: each execution streams `pieces` deltas
/// (`"piece0 "`, `"piece1 "`, …), each only once the test `release`s it,
/// so a test decides exactly which events exist at each moment.
pub struct GatedRuntime {
    pieces: usize,
    gate: Arc<tokio::sync::Semaphore>,
}

impl GatedRuntime {
    pub fn new(pieces: usize) -> Arc<Self> {
        Arc::new(Self {
            pieces,
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        })
    }

    /// Lets `n` more pieces through.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

#[async_trait]
impl AgentRuntime for GatedRuntime {
    fn name(&self) -> &'static str {
        "gated"
    }

    async fn execute(
        &self,
        _request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        use futures::StreamExt as _;
        use run_coordinator::runtime::RuntimeEvent;
        let gate = self.gate.clone();
        let pieces = futures::stream::iter(0..self.pieces).then(move |n| {
            let (gate, cancel) = (gate.clone(), cancel.clone());
            async move {
                tokio::select! {
                    permit = gate.acquire() => permit.expect("the gate stays open").forget(),
                    () = cancel.cancelled() => return None,
                }
                Some(Ok(RuntimeEvent::AssistantDelta(format!("piece{n} "))))
            }
        });
        Ok(pieces
            .take_while(|item| std::future::ready(item.is_some()))
            .filter_map(std::future::ready)
            .boxed())
    }
}

pub struct System {
    pub store_url: String,
    pub coordinator_url: String,
    /// Where the store and the coordinator serve `/metrics`.
    pub store_metrics: SocketAddr,
    pub coordinator_metrics: SocketAddr,
    pub stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl System {
    pub async fn start() -> Self {
        Self::start_with(CoordinatorConfig::default()).await
    }

    pub async fn start_with(config: CoordinatorConfig) -> Self {
        let runtime = Arc::new(StubRuntime {
            echo: EchoRuntime::new(EchoConfig::default()),
        });
        Self::start_with_runtime(config, runtime).await
    }

    pub async fn start_with_runtime(
        config: CoordinatorConfig,
        runtime: Arc<dyn AgentRuntime>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let services =
            clawgate_system_tests::local::spawn(dir.path(), runtime, config, stop.clone())
                .await
                .unwrap();
        Self {
            store_url: services.store_url,
            coordinator_url: services.coordinator_url,
            store_metrics: services.store_metrics,
            coordinator_metrics: services.coordinator_metrics,
            stop,
            _dir: dir,
        }
    }

    pub fn edge_config(&self) -> EdgeConfig {
        EdgeConfig::with_token(self.coordinator_url.clone(), self.store_url.clone(), TOKEN)
    }

    /// Starts an edge; returns its ws:// URL and its state.
    pub async fn edge(&self, config: EdgeConfig) -> (String, Arc<Edge>) {
        let (url, edge) = spawn_edge(config, &self.stop).await;
        // Ready once its coordinator event stream is open.
        let deadline = Instant::now() + DEADLINE;
        while !edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the edge never became ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (url, edge)
    }
}

/// Starts an edge on loopback port 0, serving until `stop`; returns its
/// ws:// URL and its state (not yet ready, maybe).
pub async fn spawn_edge(config: EdgeConfig, stop: &CancellationToken) -> (String, Arc<Edge>) {
    let backends = Backends::connect_lazy(&config).unwrap();
    let edge = Edge::new(config, backends);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(gateway_edge::server::serve_edge(
        edge.clone(),
        listener,
        stop.clone().cancelled_owned(),
    ));
    (url, edge)
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A raw protocol client: sends frames, collects everything received.
pub struct Client {
    pub ws: Ws,
    pub received: Vec<Value>,
    pub closed: Option<(u16, String)>,
    next_id: u64,
    /// `received[..scanned]` was already searched by `event`.
    scanned: usize,
    /// Indexes in `received` of responses already returned by `response`.
    taken: std::collections::HashSet<usize>,
}

pub const DEADLINE: Duration = Duration::from_secs(30);

impl Client {
    /// A client over an opened socket.
    fn over(ws: Ws) -> Self {
        Self {
            ws,
            received: Vec::new(),
            closed: None,
            next_id: 0,
            scanned: 0,
            taken: Default::default(),
        }
    }

    pub async fn open(url: &str) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("websocket connect");
        Self::over(ws)
    }

    /// Like `open`, with extra headers on the upgrade request; the HTTP
    /// status when the edge refuses the upgrade.
    pub async fn open_with_headers(url: &str, headers: &[(&str, &str)]) -> Result<Self, u16> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = url.into_client_request().unwrap();
        for (name, value) in headers {
            request.headers_mut().insert(
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
                    .unwrap(),
                value.parse().unwrap(),
            );
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((ws, _)) => Ok(Self::over(ws)),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                Err(response.status().as_u16())
            }
            Err(other) => panic!("upgrade failed: {other}"),
        }
    }

    /// Like `open`, with a tiny receive buffer, so that a client that stops
    /// reading backs the edge up quickly (slow-consumer tests).
    pub async fn open_small_buffer(url: &str) -> Self {
        let address = url.trim_start_matches("ws://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let stream = socket.connect(address).await.unwrap();
        let (ws, _) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
            .await
            .unwrap();
        Self::over(ws)
    }

    /// The handshake on an opened socket.
    pub async fn handshake(&mut self, scopes: &[&str]) {
        let challenge = self.next_frame().await.expect("challenge");
        assert_eq!(challenge["event"], "connect.challenge");
        let res = self.request("connect", connect_params(scopes)).await;
        assert_eq!(res["ok"], true, "connect failed: {res}");
    }

    /// Opens, reads the challenge, connects with `params`; returns hello-ok.
    pub async fn connect(url: &str, scopes: &[&str]) -> Self {
        let mut client = Self::open(url).await;
        let challenge = client.next_frame().await.expect("challenge");
        assert_eq!(challenge["event"], "connect.challenge");
        let res = client.request("connect", connect_params(scopes)).await;
        assert_eq!(res["ok"], true, "connect failed: {res}");
        client
    }

    pub async fn send(&mut self, frame: &Value) {
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }

    pub async fn send_raw(&mut self, text: String) {
        self.ws.send(Message::text(text)).await.unwrap();
    }

    /// The next frame, or `None` once closed (recording the close).
    pub async fn next_frame(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(DEADLINE, self.ws.next())
                .await
                .expect("no frame within the deadline");
            match message {
                Some(Ok(Message::Text(text))) => {
                    let value: Value = serde_json::from_str(&text).expect("frames are JSON");
                    self.received.push(value.clone());
                    return Some(value);
                }
                Some(Ok(Message::Close(frame))) => {
                    self.closed = Some(frame.map_or((1005, String::new()), |f| {
                        (f.code.into(), f.reason.to_string())
                    }));
                    return None;
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => {
                    if self.closed.is_none() {
                        self.closed = Some((1006, String::new()));
                    }
                    return None;
                }
            }
        }
    }

    pub fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("t-{}", self.next_id)
    }

    /// Sends a request and waits for its (first) response.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.fresh_id();
        self.send(&json!({ "type": "req", "id": id, "method": method, "params": params }))
            .await;
        self.response(&id).await
    }

    /// The next response with `id` not returned before (one already
    /// received, or one still to come).
    pub async fn response(&mut self, id: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let found = (0..self.received.len()).find(|i| {
                !self.taken.contains(i)
                    && self.received[*i]["type"] == "res"
                    && self.received[*i]["id"] == id
            });
            if let Some(index) = found {
                self.taken.insert(index);
                return self.received[index].clone();
            }
            assert!(Instant::now() < deadline, "no response to {id}");
            if self.next_frame().await.is_none() {
                panic!("closed while waiting for {id}: {:?}", self.closed);
            }
        }
    }

    /// The next event matching `check`: one already received (and not yet
    /// returned by this method) or one still to come.
    pub async fn event(&mut self, mut check: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            while self.scanned < self.received.len() {
                let frame = self.received[self.scanned].clone();
                self.scanned += 1;
                if frame["type"] == "event" && check(&frame) {
                    return frame;
                }
            }
            assert!(Instant::now() < deadline, "the event did not arrive");
            self.next_frame()
                .await
                .expect("closed while waiting for an event");
        }
    }

    /// Reads until the server closes; returns the close code and reason.
    pub async fn until_closed(&mut self) -> (u16, String) {
        let deadline = Instant::now() + DEADLINE;
        while self.next_frame().await.is_some() {
            assert!(Instant::now() < deadline, "the server did not close");
        }
        self.closed.clone().unwrap()
    }
}

pub fn connect_params(scopes: &[&str]) -> Value {
    json!({
        "minProtocol": 4, "maxProtocol": 4,
        "client": { "id": "cli", "version": "test", "platform": "linux", "mode": "cli" },
        "caps": [], "auth": { "token": TOKEN }, "role": "operator", "scopes": scopes,
    })
}

pub const READ: &str = "operator.read";
pub const WRITE: &str = "operator.write";
pub const ADMIN: &str = "operator.admin";

pub const QUESTIONS: &str = "operator.questions";
pub const APPROVALS: &str = "operator.approvals";

/// The scope a method needs per the protocol's table (§7, the real
/// gateway's method scopes, plus this edge's `runs.resume` extension,
/// read); `None` is exempt. Written from the spec, not from the edge's
/// code, so tests check the edge against it.
pub fn required_scope(method: &str) -> Option<&'static str> {
    required_scope_with(method, &serde_json::json!({}))
}

/// As [`required_scope`], for the methods whose scope depends on params.
pub fn required_scope_with(method: &str, params: &Value) -> Option<&'static str> {
    match method {
        "health" => None,
        "status"
        | "agents.list"
        | "chat.history"
        | "chat.startup"
        | "chat.metadata"
        | "sessions.list"
        | "sessions.describe"
        | "sessions.resolve"
        | "sessions.subscribe"
        | "sessions.unsubscribe"
        | "sessions.messages.subscribe"
        | "sessions.messages.unsubscribe"
        | "models.list"
        | "commands.list"
        | "taskSuggestions.list"
        | "runs.resume"
        | "system-presence"
        | "logs.tail"
        | "config.get"
        | "plugins.controlUi.list"
        | "sessions.observer.visibility"
        | "agent.identity.get"
        | "models.authStatus"
        | "controlUi.sessionPullRequests.subscribe"
        | "board.get"
        | "sessions.viewers.set"
        | "projects.list"
        | "talk.catalog"
        | "progressCard.get"
        | "sessions.groups.list"
        | "mentions.list"
        | "system.info"
        | "sessions.branches.list"
        | "session.discussion.info"
        | "sessions.companion.state"
        | "tasks.list"
        | "users.prefs.get"
        | "cron.list"
        | "cron.status"
        | "sessions.catalog.list"
        | "sessions.github.options"
        | "session.members.listEvidence"
        | "environments.list" => Some(READ),
        "users.prefs.set" | "sessions.groups.defaults" | "worktrees.branches" => Some(WRITE),
        "agent" | "agent.wait" | "chat.send" | "chat.abort" | "sessions.abort"
        | "sessions.send" | "sessions.create" | "sessions.patch" => Some(WRITE),
        "sessions.delete" if params.get("archivedOnly") == Some(&Value::Bool(true)) => Some(WRITE),
        "question.list" => Some(QUESTIONS),
        "plugin.approval.list" | "exec.approval.list" | "openclaw.approval.list" => Some(APPROVALS),
        _ => Some(ADMIN),
    }
}

/// Whether a connection holding the one scope `held` may call a method that
/// needs `required` (admin covers all, write covers read).
pub fn grants(held: Option<&str>, required: Option<&str>) -> bool {
    match (held, required) {
        (_, None) | (Some(ADMIN), _) => true,
        (Some(held), Some(required)) => held == required || (required == READ && held == WRITE),
        (None, Some(_)) => false,
    }
}

/// Polls `done` until it holds, failing with `what` after `within`.
pub async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

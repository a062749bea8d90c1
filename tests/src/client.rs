//! The tests' client of the edge's WebSocket protocol (v4), on the shared
//! protocol client (`clawgate-client`: the socket, the frames, the connect
//! params). It keeps every frame it receives, in arrival order
//! (`received`), and how the socket closed (`closed`), so a test asserts
//! on what it got; and it panics, saying what it waited for, when the edge
//! does not answer in time or closes while a test waits. The socket itself
//! is `ws`: a test can send what no client would.

use std::collections::HashSet;
use std::time::Duration;

use clawgate_client::socket::{self, next_text};
use clawgate_client::{ClientError, ClientInfo, ConnectParams, OpenOptions};
use serde_json::{Map, Value};
use tokio::time::Instant;

/// The shared secret clients present.
pub const TOKEN: &str = "test-token-0123456789";

/// The throwaway token of the fixtures recorded against the official
/// gateway: shorter than the 16 bytes an edge takes, so a replay puts
/// [`TOKEN`] in its place ([`with_test_token`]).
pub const CAPTURED_TOKEN: &str = "testtoken";

/// A recorded `connect` frame with [`CAPTURED_TOKEN`] replaced by
/// [`TOKEN`] in `auth.token`; other frames as they are.
pub fn with_test_token(frame: &Value) -> Value {
    let mut frame = frame.clone();
    if frame["method"] == "connect" && frame["params"]["auth"]["token"] == CAPTURED_TOKEN {
        frame["params"]["auth"]["token"] = Value::from(TOKEN);
    }
    frame
}

/// Read, write and admin: every method the edge serves.
pub const OPERATOR_SCOPES: &[&str] = &["operator.read", "operator.write", "operator.admin"];

/// How long a frame, a response or an awaited event may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A client's socket.
pub type Ws = clawgate_client::WebSocket;

/// Who the tests' clients say they are.
pub fn client_info() -> ClientInfo {
    let mut client = ClientInfo::new("cli", "cli", "test");
    // Fixed, not this machine's: device signatures cover it.
    client.platform = "linux".into();
    client
}

/// The `connect` params of an operator with `scopes` and the token.
pub fn connect_params(scopes: &[&str]) -> Value {
    ConnectParams::operator(client_info(), scopes)
        .token(TOKEN)
        .to_json()
}

pub struct Client {
    pub ws: Ws,
    /// Every frame received, in order.
    pub received: Vec<Value>,
    /// The close code and reason, once closed (1005: a close without a
    /// frame, 1006: the connection failed or ended).
    pub closed: Option<(u16, String)>,
    /// The `hello-ok` payload, after a handshake.
    hello: Value,
    next_id: u64,
    /// `received[..scanned]` was already searched by `event`.
    scanned: usize,
    /// Indexes in `received` of responses already returned by `response`.
    taken: HashSet<usize>,
}

impl Client {
    fn over(ws: Ws) -> Self {
        Self {
            ws,
            received: Vec::new(),
            closed: None,
            hello: Value::Null,
            next_id: 0,
            scanned: 0,
            taken: HashSet::new(),
        }
    }

    async fn open_with(url: &str, options: &OpenOptions) -> Result<Self, ClientError> {
        Ok(Self::over(socket::open(url, options).await?))
    }

    /// Opens the socket, no handshake yet.
    pub async fn open(url: &str) -> Self {
        Self::open_with(url, &OpenOptions::default())
            .await
            .unwrap_or_else(|e| panic!("websocket connect: {e}"))
    }

    /// Like `open`, with extra headers on the upgrade request; the HTTP
    /// status when the edge refuses the upgrade.
    pub async fn open_with_headers(url: &str, headers: &[(&str, &str)]) -> Result<Self, u16> {
        let options = OpenOptions {
            headers: headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            ..OpenOptions::default()
        };
        match Self::open_with(url, &options).await {
            Ok(client) => Ok(client),
            Err(ClientError::UpgradeRefused { status, .. }) => Err(status),
            Err(other) => panic!("upgrade failed: {other}"),
        }
    }

    /// Like `open`, from the local address `source` (a loopback alias such
    /// as 127.0.0.2, so that per-address limits see another client); the
    /// HTTP status and body when the edge refuses the upgrade.
    pub async fn open_from(url: &str, source: std::net::IpAddr) -> Result<Self, (u16, String)> {
        let options = OpenOptions {
            source: Some(source),
            ..OpenOptions::default()
        };
        match Self::open_with(url, &options).await {
            Ok(client) => Ok(client),
            Err(ClientError::UpgradeRefused { status, body }) => Err((status, body)),
            Err(other) => panic!("websocket connect from {source}: {other}"),
        }
    }

    /// Opens from `source` and connects as an operator with `scopes`.
    pub async fn connect_from(url: &str, source: std::net::IpAddr, scopes: &[&str]) -> Self {
        let mut client = Self::open_from(url, source)
            .await
            .unwrap_or_else(|refused| panic!("upgrade from {source} refused: {refused:?}"));
        client.handshake(scopes).await;
        client
    }

    /// Like `open`, with a tiny receive buffer, so that a client that stops
    /// reading backs the edge up quickly (slow-consumer tests).
    pub async fn open_small_buffer(url: &str) -> Self {
        let options = OpenOptions {
            receive_buffer: Some(4096),
            ..OpenOptions::default()
        };
        Self::open_with(url, &options)
            .await
            .unwrap_or_else(|e| panic!("websocket connect: {e}"))
    }

    /// The handshake on an opened socket as an operator with `scopes` and
    /// the token.
    pub async fn handshake(&mut self, scopes: &[&str]) {
        self.handshake_with(connect_params(scopes)).await;
    }

    /// The handshake with `connect` params of the test's own; panics when
    /// the edge refuses.
    pub async fn handshake_with(&mut self, params: Value) {
        let challenge = self.next_frame().await.expect("challenge");
        assert_eq!(challenge["event"], "connect.challenge", "{challenge}");
        assert!(
            challenge["payload"]["nonce"].is_string(),
            "challenge without a nonce: {challenge}"
        );
        let res = self.request("connect", params).await;
        assert!(
            res["ok"] == true && res["payload"]["type"] == "hello-ok",
            "connect failed: {res}"
        );
        self.hello = res["payload"].clone();
    }

    /// Opens and connects as an operator with `scopes` and the token.
    pub async fn connect(url: &str, scopes: &[&str]) -> Self {
        let mut client = Self::open(url).await;
        client.handshake(scopes).await;
        client
    }

    /// Opens and connects as an operator with `scopes` and `token`.
    pub async fn connect_with_token(url: &str, token: &str, scopes: &[&str]) -> Self {
        let mut client = Self::open(url).await;
        client.handshake_with_token(token, scopes).await;
        client
    }

    /// The handshake on an opened socket as an operator with `scopes` and
    /// `token`.
    pub async fn handshake_with_token(&mut self, token: &str, scopes: &[&str]) {
        let params = ConnectParams::operator(client_info(), scopes).token(token);
        self.handshake_with(params.to_json()).await;
    }

    /// The `hello-ok` payload.
    pub fn hello(&self) -> &Value {
        &self.hello
    }

    /// Every event received so far (including `connect.challenge`).
    pub fn events(&self) -> impl Iterator<Item = &Value> {
        self.received.iter().filter(|f| f["type"] == "event")
    }

    pub async fn send(&mut self, frame: &Value) {
        self.send_raw(frame.to_string()).await;
    }

    pub async fn send_raw(&mut self, text: String) {
        socket::send_text(&mut self.ws, text)
            .await
            .unwrap_or_else(|e| panic!("cannot send: {e}"));
    }

    pub fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("t-{}", self.next_id)
    }

    /// Sends a request frame with `extra` top-level members besides `type`,
    /// `id`, `method` and `params` (e.g. `traceparent`); returns its id.
    pub async fn send_request(
        &mut self,
        method: &str,
        params: Value,
        extra: Map<String, Value>,
    ) -> String {
        let id = self.fresh_id();
        let frame = clawgate_client::frame::request_with(&id, method, params, extra);
        self.send(&frame).await;
        id
    }

    /// Sends a request and waits for its (first) response.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params, Map::new()).await;
        self.response(&id).await
    }

    /// The next frame, or `None` once closed (recording the close).
    pub async fn next_frame(&mut self) -> Option<Value> {
        let deadline = Instant::now() + DEADLINE;
        match next_text(&mut self.ws, Some(deadline), "a frame").await {
            Ok(text) => {
                let frame: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("a frame that is not JSON ({e}): {text}"));
                self.received.push(frame.clone());
                Some(frame)
            }
            Err(ClientError::TimedOut { .. }) => panic!("no frame within the deadline"),
            Err(ClientError::Closed(close)) => {
                self.closed = Some(close.map_or((1005, String::new()), |c| (c.code, c.reason)));
                None
            }
            Err(_) => {
                if self.closed.is_none() {
                    self.closed = Some((1006, String::new()));
                }
                None
            }
        }
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
    /// searched by this method) or one still to come.
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

    /// The first event matching `check` of all received so far, or the
    /// next to come. Events stay, so the same one can be found again.
    pub async fn find_event(&mut self, mut check: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        let mut searched = 0;
        loop {
            let fresh = &self.received[searched..];
            if let Some(found) = fresh.iter().find(|f| f["type"] == "event" && check(f)) {
                return found.clone();
            }
            searched = self.received.len();
            assert!(
                Instant::now() < deadline,
                "no awaited event within {DEADLINE:?}; events so far:\n{}",
                self.events()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            if self.next_frame().await.is_none() {
                panic!("closed waiting for an event: {:?}", self.closed);
            }
        }
    }

    /// The `chat` event that ends run `run_id` (state `final`, `aborted` or
    /// `error`), received before or still to come.
    pub async fn chat_end(&mut self, run_id: &str) -> Value {
        self.find_event(|e| {
            e["event"] == "chat"
                && e["payload"]["runId"] == run_id
                && matches!(
                    e["payload"]["state"].as_str(),
                    Some("final" | "aborted" | "error")
                )
        })
        .await
    }

    /// The `agent` lifecycle event saying run `run_id` started executing.
    pub async fn run_started(&mut self, run_id: &str) -> Value {
        self.find_event(|e| {
            e["event"] == "agent"
                && e["payload"]["runId"] == run_id
                && e["payload"]["stream"] == "lifecycle"
                && e["payload"]["data"]["phase"] == "start"
        })
        .await
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

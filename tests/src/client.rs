//! A minimal client of the edge's WebSocket protocol (v4): answers the
//! `connect.challenge` with `connect`, then sends `req` frames and matches
//! `res` frames by id. Every event that arrives meanwhile is kept, so a
//! test can look for one after the fact.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Read, write and admin: every method the edge serves.
pub const OPERATOR_SCOPES: &[&str] = &["operator.read", "operator.write", "operator.admin"];

/// How long a response or an awaited event may take.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(20);

pub struct EdgeClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    hello: Value,
    events: Vec<Value>,
    /// Responses received while waiting for something else, by arrival.
    responses: Vec<Value>,
    next_id: u64,
}

impl EdgeClient {
    /// Opens the socket and completes the handshake as an operator with
    /// `token`; panics when the edge refuses.
    pub async fn connect(url: &str, token: &str, scopes: &[&str]) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
        let mut client = Self {
            ws,
            hello: Value::Null,
            events: Vec::new(),
            responses: Vec::new(),
            next_id: 0,
        };
        let challenge = client.event(|e| e["event"] == "connect.challenge").await;
        assert!(
            challenge["payload"]["nonce"].is_string(),
            "challenge without a nonce: {challenge}"
        );
        let params = json!({
            "minProtocol": 4,
            "maxProtocol": 4,
            "client": {
                "id": "test",
                "version": env!("CARGO_PKG_VERSION"),
                "platform": std::env::consts::OS,
                "mode": "test",
            },
            "caps": [],
            "auth": { "token": token },
            "role": "operator",
            "scopes": scopes,
        });
        let res = client.request("connect", params).await;
        assert!(
            res["ok"] == true && res["payload"]["type"] == "hello-ok",
            "connect refused: {res}"
        );
        client.hello = res["payload"].clone();
        client
    }

    /// The `hello-ok` payload.
    pub fn hello(&self) -> &Value {
        &self.hello
    }

    /// Every event received so far (including `connect.challenge`).
    pub fn events(&self) -> &[Value] {
        &self.events
    }

    /// Sends a request and returns its response frame (`ok` true or false).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params, Map::new()).await;
        self.response(&id).await
    }

    /// Sends a request frame with `extra` top-level members besides
    /// `type`, `id`, `method` and `params` (e.g. `traceparent`); returns its id.
    pub async fn send(&mut self, method: &str, params: Value, extra: Map<String, Value>) -> String {
        self.next_id += 1;
        let id = format!("req-{}", self.next_id);
        let mut frame = extra;
        frame.insert("type".into(), json!("req"));
        frame.insert("id".into(), json!(id));
        frame.insert("method".into(), json!(method));
        frame.insert("params".into(), params);
        let text = Value::Object(frame).to_string();
        self.ws
            .send(Message::text(text))
            .await
            .unwrap_or_else(|e| panic!("cannot send {method}: {e}"));
        id
    }

    /// The response to request `id`, received before or still to come.
    pub async fn response(&mut self, id: &str) -> Value {
        let deadline = Instant::now() + FRAME_TIMEOUT;
        loop {
            if let Some(at) = self.responses.iter().position(|r| r["id"] == id) {
                return self.responses.remove(at);
            }
            let what = format!("the response to {id}");
            self.receive(deadline, &what).await;
        }
    }

    /// The first event (received before or still to come) for which
    /// `matches` holds. Events are kept, so the same one can be found again.
    pub async fn event(&mut self, mut matches: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + FRAME_TIMEOUT;
        let mut checked = 0;
        loop {
            if let Some(found) = self.events[checked..].iter().find(|e| matches(e)) {
                return found.clone();
            }
            checked = self.events.len();
            self.receive(deadline, "an awaited event").await;
        }
    }

    /// The `chat` event that ends run `run_id` (state `final`, `aborted` or
    /// `error`).
    pub async fn chat_end(&mut self, run_id: &str) -> Value {
        self.event(|e| {
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
        self.event(|e| {
            e["event"] == "agent"
                && e["payload"]["runId"] == run_id
                && e["payload"]["stream"] == "lifecycle"
                && e["payload"]["data"]["phase"] == "start"
        })
        .await
    }

    /// Reads one frame and files it as an event or a response; panics
    /// (naming `what` it waited for) at the deadline or when the edge closes.
    async fn receive(&mut self, deadline: Instant, what: &str) {
        loop {
            let message = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => panic!("socket failed waiting for {what}: {e}"),
                Ok(None) => panic!("socket closed waiting for {what}"),
                Err(_) => panic!(
                    "no {what} within {FRAME_TIMEOUT:?}; events so far:\n{}",
                    self.events
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            };
            let text = match message {
                Message::Text(text) => text,
                Message::Close(frame) => panic!("the edge closed ({frame:?}) waiting for {what}"),
                // Pings are answered by the library; nothing else is sent.
                _ => continue,
            };
            let frame: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("a frame that is not JSON ({e}): {text}"));
            match frame["type"].as_str() {
                Some("event") => self.events.push(frame),
                Some("res") => self.responses.push(frame),
                _ => panic!("unexpected frame: {frame}"),
            }
            return;
        }
    }
}

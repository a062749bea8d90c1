//! The client side of the gateway protocol v4: open the socket, answer the
//! `connect.challenge` with `connect`, then send requests and match their
//! responses by id. Events that arrive meanwhile are queued, so a caller
//! reading the event stream afterwards misses none of them.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long the handshake may take at most (the official client gives up on
/// a missing challenge after about as long).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The process exit codes; see `EXIT_CODES` in `main.rs` for the help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Could not connect, the connection was lost, or no answer in time.
    Connection = 3,
    /// The gateway rejected `connect` (authentication or handshake).
    Auth = 4,
    /// A request got an error response.
    Request = 5,
    /// The run ended aborted or timed out.
    Aborted = 6,
    /// The run ended in error.
    RunError = 7,
    /// Waiting for the run gave up before it finished.
    WaitTimeout = 8,
}

/// Why a command did not succeed: what to print and how to exit.
#[derive(Debug, Clone)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
    /// The protocol error code (`INVALID_REQUEST`, …), when the server sent one.
    pub code: Option<String>,
    /// The protocol error's `details`, when sent.
    pub details: Option<Value>,
    /// A deadline passed (rather than the gateway answering or closing).
    pub timed_out: bool,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
            code: None,
            details: None,
            timed_out: false,
        }
    }

    /// From a protocol `ErrorShape`.
    pub fn from_error(exit: Exit, error: &Value) -> Self {
        let message = error["message"].as_str().unwrap_or("request failed");
        Self {
            code: error["code"].as_str().map(str::to_owned),
            details: error.get("details").cloned(),
            ..Self::new(exit, message)
        }
    }

    fn timeout(what: &str) -> Self {
        Self {
            timed_out: true,
            ..Self::new(Exit::Connection, format!("timed out waiting for {what}"))
        }
    }

    /// `details.code`, the machine-readable reason of handshake failures.
    pub fn detail_code(&self) -> Option<&str> {
        self.details.as_ref()?.get("code")?.as_str()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match (self.code.as_deref(), self.detail_code()) {
            (Some(code), Some(detail)) => write!(f, " ({code}, {detail})"),
            (Some(code), None) => write!(f, " ({code})"),
            (None, Some(detail)) => write!(f, " ({detail})"),
            (None, None) => Ok(()),
        }
    }
}

/// Who connects, and how.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub url: String,
    pub token: Option<String>,
    pub password: Option<String>,
    pub scopes: Vec<String>,
}

/// A `res` frame.
#[derive(Debug, Clone)]
pub struct Response {
    pub ok: bool,
    /// `Null` when absent.
    pub payload: Value,
    /// The `ErrorShape`, on `ok:false`.
    pub error: Option<Value>,
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// An authenticated connection to the gateway.
pub struct Gateway {
    socket: Socket,
    next_id: u64,
    /// Events received while waiting for a response, oldest first.
    events: VecDeque<Value>,
    /// When the whole command must be done (`--timeout`).
    deadline: Option<Instant>,
    /// The `hello-ok` payload.
    pub hello: Value,
}

fn earliest(a: Option<Instant>, b: Instant) -> Instant {
    a.map_or(b, |a| a.min(b))
}

impl Gateway {
    /// Opens the socket and performs the handshake.
    pub async fn connect(
        options: &ConnectOptions,
        deadline: Option<Instant>,
    ) -> Result<Self, Failure> {
        let handshake_deadline = earliest(deadline, Instant::now() + HANDSHAKE_TIMEOUT);
        let opened = tokio::time::timeout_at(
            handshake_deadline,
            tokio_tungstenite::connect_async(options.url.as_str()),
        )
        .await
        .map_err(|_| Failure::timeout(&format!("a connection to {}", options.url)))?;
        let (socket, _) = opened.map_err(|e| {
            Failure::new(
                Exit::Connection,
                format!("cannot connect to {}: {e}", options.url),
            )
        })?;
        let mut gateway = Self {
            socket,
            next_id: 0,
            events: VecDeque::new(),
            deadline,
            hello: Value::Null,
        };
        let challenge = gateway
            .next_frame(Some(handshake_deadline), "connect.challenge")
            .await?;
        if challenge["event"] != "connect.challenge" {
            return Err(Failure::new(
                Exit::Connection,
                "the gateway did not send connect.challenge first",
            ));
        }
        let mut auth = serde_json::Map::new();
        if let Some(token) = &options.token {
            auth.insert("token".into(), json!(token));
        }
        if let Some(password) = &options.password {
            auth.insert("password".into(), json!(password));
        }
        let params = json!({
            "minProtocol": 4,
            "maxProtocol": 4,
            "client": {
                "id": "cli",
                "version": env!("CARGO_PKG_VERSION"),
                "platform": std::env::consts::OS,
                "mode": "cli",
            },
            "caps": [],
            "role": "operator",
            "scopes": options.scopes,
            "auth": auth,
        });
        let id = gateway.send_request("connect", params).await?;
        let response = gateway
            .response(&id, Some(handshake_deadline), "the connect response")
            .await?;
        match response.error {
            Some(error) if !response.ok => Err(Failure::from_error(Exit::Auth, &error)),
            _ => {
                gateway.hello = response.payload;
                Ok(gateway)
            }
        }
    }

    /// Sends a request and returns its (first) response, whatever it says.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Response, Failure> {
        let id = self.send_request(method, params).await?;
        let what = format!("the {method} response");
        self.response(&id, self.deadline, &what).await
    }

    /// Sends a request; its payload on success, a `Request` failure otherwise.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, Failure> {
        let response = self.call(method, params).await?;
        if response.ok {
            return Ok(response.payload);
        }
        let error = response.error.unwrap_or_else(|| json!({}));
        Err(Failure::from_error(Exit::Request, &error))
    }

    /// The next event frame (`{type:"event", event, payload, seq?}`).
    pub async fn next_event(&mut self) -> Result<Value, Failure> {
        if let Some(event) = self.events.pop_front() {
            return Ok(event);
        }
        loop {
            let frame = self.next_frame(self.deadline, "events").await?;
            if frame["type"] == "event" {
                return Ok(frame);
            }
        }
    }

    /// Closes the socket politely (best effort).
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }

    async fn send_request(&mut self, method: &str, params: Value) -> Result<String, Failure> {
        self.next_id += 1;
        let id = format!("cli-{}", self.next_id);
        let frame = json!({ "type": "req", "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|e| Failure::new(Exit::Connection, format!("connection lost: {e}")))?;
        Ok(id)
    }

    /// Reads until the response with `id`, queueing events on the way.
    async fn response(
        &mut self,
        id: &str,
        deadline: Option<Instant>,
        what: &str,
    ) -> Result<Response, Failure> {
        loop {
            let frame = self.next_frame(deadline, what).await?;
            match frame["type"].as_str() {
                Some("res") if frame["id"] == id => {
                    return Ok(Response {
                        ok: frame["ok"] == true,
                        payload: frame.get("payload").cloned().unwrap_or(Value::Null),
                        error: frame.get("error").cloned(),
                    });
                }
                Some("event") => self.events.push_back(frame),
                // A response to something else (nothing else is pending).
                _ => {}
            }
        }
    }

    /// The next JSON frame; a closed socket or a passed deadline is a failure.
    async fn next_frame(
        &mut self,
        deadline: Option<Instant>,
        what: &str,
    ) -> Result<Value, Failure> {
        loop {
            let next = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, self.socket.next())
                    .await
                    .map_err(|_| Failure::timeout(what))?,
                None => self.socket.next().await,
            };
            let text = match next {
                Some(Ok(Message::Text(text))) => text.to_string(),
                Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
                Some(Ok(Message::Close(frame))) => {
                    let why = frame
                        .map(|f| format!(" ({} {})", u16::from(f.code), f.reason))
                        .unwrap_or_default();
                    return Err(Failure::new(
                        Exit::Connection,
                        format!("the gateway closed the connection{why}"),
                    ));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    return Err(Failure::new(
                        Exit::Connection,
                        format!("connection lost: {e}"),
                    ));
                }
                None => return Err(Failure::new(Exit::Connection, "connection lost")),
            };
            // The protocol only sends JSON objects; anything else is skipped.
            if let Ok(frame @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
                return Ok(frame);
            }
        }
    }
}

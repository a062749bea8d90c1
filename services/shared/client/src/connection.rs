//! An authenticated connection: requests matched to their responses by
//! id, the events that arrive meanwhile queued in arrival order.

use std::collections::VecDeque;

use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::frame::{ConnectParams, request_with};
use crate::socket::{self, OpenOptions, WebSocket};

/// A `res` frame.
#[derive(Debug, Clone)]
pub struct Response {
    /// The whole frame, as received.
    pub frame: Value,
}

impl Response {
    /// Whether the request succeeded (`ok: true`).
    pub fn ok(&self) -> bool {
        self.frame["ok"] == true
    }

    /// The payload (`Null` when absent).
    pub fn payload(&self) -> &Value {
        &self.frame["payload"]
    }

    /// The `ErrorShape` of a failed request, when sent.
    pub fn error(&self) -> Option<&Value> {
        self.frame.get("error")
    }
}

/// A connection past its handshake.
pub struct Connection {
    socket: WebSocket,
    next_id: u64,
    /// Events read while waiting for responses, oldest first: none is lost
    /// to a reader of the event stream.
    events: VecDeque<Value>,
    hello: Value,
}

impl Connection {
    /// Opens the socket at `url` and completes the handshake with `params`,
    /// both by `deadline`.
    pub async fn connect(
        url: &str,
        options: &OpenOptions,
        params: &ConnectParams,
        deadline: Instant,
    ) -> Result<Self, ClientError> {
        let mut socket = tokio::time::timeout_at(deadline, socket::open(url, options))
            .await
            .map_err(|_| ClientError::TimedOut {
                what: format!("a connection to {url}"),
            })??;
        let handshake = socket::handshake(&mut socket, params, deadline).await?;
        Ok(Self {
            socket,
            next_id: 0,
            events: VecDeque::new(),
            hello: handshake.hello,
        })
    }

    /// The `hello-ok` payload.
    pub fn hello(&self) -> &Value {
        &self.hello
    }

    /// Sends a request with `extra` top-level members (none: an empty
    /// map); its id.
    pub async fn send_request(
        &mut self,
        method: &str,
        params: Value,
        extra: Map<String, Value>,
    ) -> Result<String, ClientError> {
        self.next_id += 1;
        let id = format!("req-{}", self.next_id);
        let frame = request_with(&id, method, params, extra);
        socket::send_json(&mut self.socket, &frame).await?;
        Ok(id)
    }

    /// Sends a request and returns its response, whatever it says, read
    /// by `deadline` (`None`: no limit).
    pub async fn call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Option<Instant>,
    ) -> Result<Response, ClientError> {
        let id = self.send_request(method, params, Map::new()).await?;
        self.read_response(&id, deadline, &format!("the {method} response"))
            .await
    }

    /// The response to request `id`, read by `deadline`. Responses to
    /// other requests read meanwhile are dropped.
    pub async fn response(
        &mut self,
        id: &str,
        deadline: Option<Instant>,
    ) -> Result<Response, ClientError> {
        self.read_response(id, deadline, &format!("the response to {id}"))
            .await
    }

    async fn read_response(
        &mut self,
        id: &str,
        deadline: Option<Instant>,
        what: &str,
    ) -> Result<Response, ClientError> {
        loop {
            let frame = socket::next_json(&mut self.socket, deadline, what).await?;
            match frame["type"].as_str() {
                Some("res") if frame["id"] == id => return Ok(Response { frame }),
                Some("event") => self.events.push_back(frame),
                _ => {}
            }
        }
    }

    /// The next event frame (`{type:"event", event, payload, seq?}`): a
    /// queued one, or the next to arrive by `deadline`.
    pub async fn next_event(&mut self, deadline: Option<Instant>) -> Result<Value, ClientError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(event);
        }
        loop {
            let frame = socket::next_json(&mut self.socket, deadline, "events").await?;
            if frame["type"] == "event" {
                return Ok(frame);
            }
        }
    }

    /// The events queued while waiting for responses, oldest first; the
    /// queue is empty afterwards.
    pub fn take_events(&mut self) -> Vec<Value> {
        self.events.drain(..).collect()
    }

    /// Closes the socket politely (best effort).
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

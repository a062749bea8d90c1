//! A lean client of the gateway protocol v4 for load: the handshake, and
//! requests matched to their answers by id while events are counted and
//! the ones a scenario waits for are kept.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long any one answer may take before the scenario fails.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Client {
    socket: Socket,
    next_id: u64,
    /// Events read while waiting for answers.
    pub events: u64,
}

impl Client {
    /// Opens a socket and completes the handshake; the time from opening
    /// the TCP connection to `hello-ok`.
    pub async fn connect(url: &str, token: &str) -> anyhow::Result<(Self, Duration)> {
        let started = Instant::now();
        let (socket, _) = tokio_tungstenite::connect_async(url)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        let mut client = Self {
            socket,
            next_id: 0,
            events: 0,
        };
        let challenge = client.frame().await?;
        if challenge["event"] != "connect.challenge" {
            bail!("expected connect.challenge, got {challenge}");
        }
        let connect = json!({
            "type": "req", "id": "connect", "method": "connect",
            "params": {
                "minProtocol": 4, "maxProtocol": 4,
                "client": { "id": "gateway-client", "version": env!("CARGO_PKG_VERSION"), "platform": std::env::consts::OS, "mode": "backend" },
                "role": "operator", "scopes": ["operator.read", "operator.write"],
                "caps": [], "auth": { "token": token },
            },
        });
        client.send(&connect).await?;
        let hello = client.answer("connect").await?;
        if hello["ok"] != true {
            bail!("connect refused: {}", hello["error"]);
        }
        Ok((client, started.elapsed()))
    }

    async fn send(&mut self, frame: &Value) -> anyhow::Result<()> {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .context("sending a frame")
    }

    /// The next JSON frame.
    async fn frame(&mut self) -> anyhow::Result<Value> {
        loop {
            let message = tokio::time::timeout(ANSWER_TIMEOUT, self.socket.next())
                .await
                .context("no frame in time")?;
            match message {
                Some(Ok(Message::Text(text))) => return Ok(serde_json::from_str(&text)?),
                Some(Ok(Message::Close(close))) => {
                    bail!("the gateway closed the socket: {close:?}")
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => bail!("the socket failed: {e}"),
                None => bail!("the socket ended"),
            }
        }
    }

    /// Frames until the answer to `id` (events are counted, not kept).
    async fn answer(&mut self, id: &str) -> anyhow::Result<Value> {
        loop {
            let frame = self.frame().await?;
            if frame["type"] == "res" && frame["id"] == id {
                return Ok(frame);
            }
            self.events += 1;
        }
    }

    /// Sends `method` and waits for its answer; the answer and the time.
    pub async fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> anyhow::Result<(Value, Duration)> {
        self.next_id += 1;
        let id = format!("b{}", self.next_id);
        let started = Instant::now();
        self.send(&json!({ "type": "req", "id": id, "method": method, "params": params }))
            .await?;
        let answer = self.answer(&id).await?;
        if answer["ok"] != true {
            bail!("{method} failed: {}", answer["error"]);
        }
        Ok((answer, started.elapsed()))
    }

    /// Waits for the `chat` event that ends `run_id`; the time from `from`.
    pub async fn until_chat_end(
        &mut self,
        run_id: &str,
        from: Instant,
    ) -> anyhow::Result<Duration> {
        loop {
            let frame = self.frame().await?;
            let payload = &frame["payload"];
            let ended = frame["event"] == "chat"
                && payload["runId"] == run_id
                && payload["state"] != "delta"
                && payload["state"] != "status";
            if ended {
                if payload["state"] != "final" {
                    bail!("run {run_id} ended {}", payload["state"]);
                }
                return Ok(from.elapsed());
            }
            self.events += 1;
        }
    }
}

//! A lean client of the gateway protocol v4 for load: the handshake, and
//! requests matched to their answers by id while events are counted, the
//! `chat` events of watched runs noted with their arrival time.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long an answer, or a run's end, may take before the scenario
/// fails; other frames arriving meanwhile (ticks, other runs' events) do
/// not extend it.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(300);

/// The scopes of a client that sends.
pub const READ_WRITE: &[&str] = &["operator.read", "operator.write"];
/// The scopes of a client that only watches.
pub const READ_ONLY: &[&str] = &["operator.read"];

/// How a connection presents itself.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub scopes: &'static [&'static str],
    /// The local address to connect from (a loopback alias, say).
    pub source: Option<IpAddr>,
    /// `client.instanceId` in `connect` (presence lists it).
    pub instance_id: Option<String>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            scopes: READ_WRITE,
            source: None,
            instance_id: None,
        }
    }
}

/// A `chat` delta of a watched run, when it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// The run's number (its runId after the watched prefix).
    pub run: u32,
    pub seq: u64,
    pub at: Instant,
}

pub struct Client {
    socket: Socket,
    next_id: u64,
    /// Events read while waiting for answers.
    pub events: u64,
    /// The runId prefix of the runs whose `chat` events are noted.
    watch: Option<String>,
    /// Deltas of watched runs, in arrival order.
    pub deltas: Vec<Arrival>,
    /// Watched runs that ended (a `chat` final, aborted or error).
    pub ended: usize,
}

/// The socket address a `ws://` URL names, of the family of `like`.
pub async fn resolve(url: &str, like: Option<IpAddr>) -> anyhow::Result<SocketAddr> {
    let request = url.into_client_request()?;
    let uri = request.uri();
    let host = uri.host().context("the URL has no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .find(|a| like.is_none_or(|l| l.is_ipv4() == a.is_ipv4()))
        .with_context(|| format!("{host} has no address of the family wanted"))
}

/// An upgrade's failure, with what the gateway said when it refused.
fn refusal(error: tokio_tungstenite::tungstenite::Error) -> anyhow::Error {
    match error {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            let body = response.body().as_deref().unwrap_or_default();
            anyhow::anyhow!(
                "the upgrade was refused: HTTP {} {:?}",
                response.status(),
                String::from_utf8_lossy(body).trim()
            )
        }
        other => other.into(),
    }
}

impl Client {
    /// Opens a socket and completes the handshake with read and write
    /// scopes; the time from opening the TCP connection to `hello-ok`.
    pub async fn connect(url: &str, token: &str) -> anyhow::Result<(Self, Duration)> {
        Self::connect_with(url, token, &ConnectOptions::default()).await
    }

    /// [`connect`](Self::connect) as `options` say. Sockets have Nagle off.
    pub async fn connect_with(
        url: &str,
        token: &str,
        options: &ConnectOptions,
    ) -> anyhow::Result<(Self, Duration)> {
        let started = Instant::now();
        let socket = match options.source {
            None => {
                tokio_tungstenite::connect_async_with_config(url, None, true)
                    .await
                    .map_err(refusal)
                    .with_context(|| format!("connecting to {url}"))?
                    .0
            }
            Some(source) => {
                let address = resolve(url, Some(source)).await?;
                let socket = match source {
                    IpAddr::V4(_) => TcpSocket::new_v4()?,
                    IpAddr::V6(_) => TcpSocket::new_v6()?,
                };
                socket
                    .bind(SocketAddr::new(source, 0))
                    .with_context(|| format!("binding a socket to {source}"))?;
                let stream = socket
                    .connect(address)
                    .await
                    .with_context(|| format!("connecting to {address} from {source}"))?;
                stream.set_nodelay(true)?;
                tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
                    .await
                    .map_err(refusal)
                    .with_context(|| format!("upgrading to a WebSocket at {url}"))?
                    .0
            }
        };
        let mut client = Self {
            socket,
            next_id: 0,
            events: 0,
            watch: None,
            deltas: Vec::new(),
            ended: 0,
        };
        let challenge = client.frame(Instant::now() + OPERATION_TIMEOUT).await?;
        if challenge["event"] != "connect.challenge" {
            bail!("expected connect.challenge, got {challenge}");
        }
        let mut info = json!({
            "id": "gateway-client", "version": env!("CARGO_PKG_VERSION"),
            "platform": std::env::consts::OS, "mode": "backend",
        });
        if let Some(instance) = &options.instance_id {
            info["instanceId"] = json!(instance);
        }
        let connect = json!({
            "type": "req", "id": "connect", "method": "connect",
            "params": {
                "minProtocol": 4, "maxProtocol": 4, "client": info,
                "role": "operator", "scopes": options.scopes,
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

    /// Notes the `chat` events of runs whose runId is `prefix` + a number.
    pub fn watch(&mut self, prefix: impl Into<String>) {
        self.watch = Some(prefix.into());
    }

    async fn send(&mut self, frame: &Value) -> anyhow::Result<()> {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .context("sending a frame")
    }

    /// The next JSON frame (a watched run's `chat` event noted first), if
    /// it comes before `deadline`.
    async fn frame(&mut self, deadline: Instant) -> anyhow::Result<Value> {
        loop {
            let message = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .with_context(|| format!("nothing awaited came within {OPERATION_TIMEOUT:?}"))?;
            match message {
                Some(Ok(Message::Text(text))) => {
                    let at = Instant::now();
                    let frame: Value = serde_json::from_str(&text)?;
                    self.observe(&frame, at);
                    return Ok(frame);
                }
                Some(Ok(Message::Close(close))) => {
                    bail!("the gateway closed the socket: {close:?}")
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => bail!("the socket failed: {e}"),
                None => bail!("the socket ended"),
            }
        }
    }

    fn observe(&mut self, frame: &Value, at: Instant) {
        let Some(prefix) = &self.watch else { return };
        if frame["event"] != "chat" {
            return;
        }
        let payload = &frame["payload"];
        let run = payload["runId"]
            .as_str()
            .and_then(|id| id.strip_prefix(prefix.as_str()))
            .and_then(|n| n.parse::<u32>().ok());
        let Some(run) = run else { return };
        match payload["state"].as_str() {
            Some("delta") => self.deltas.push(Arrival {
                run,
                seq: payload["seq"].as_u64().unwrap_or_default(),
                at,
            }),
            Some("final" | "aborted" | "error") => self.ended += 1,
            _ => {}
        }
    }

    /// Frames until the answer to `id` (events are counted, not kept).
    async fn answer(&mut self, id: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        loop {
            let frame = self.frame(deadline).await?;
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
        let answer = self
            .answer(&id)
            .await
            .with_context(|| format!("waiting for the answer to {method}"))?;
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
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        loop {
            let frame = self
                .frame(deadline)
                .await
                .with_context(|| format!("waiting for run {run_id} to end"))?;
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

    /// Reads frames until `runs` watched runs ended; fails when watched
    /// runs make no progress for [`OPERATION_TIMEOUT`].
    pub async fn until_ended(&mut self, runs: usize) -> anyhow::Result<()> {
        let mut deadline = Instant::now() + OPERATION_TIMEOUT;
        let mut progress = (self.ended, self.deltas.len());
        while self.ended < runs {
            self.frame(deadline)
                .await
                .with_context(|| format!("{} of {runs} watched runs ended", self.ended))?;
            self.events += 1;
            if (self.ended, self.deltas.len()) != progress {
                progress = (self.ended, self.deltas.len());
                deadline = Instant::now() + OPERATION_TIMEOUT;
            }
        }
        Ok(())
    }

    /// Reads until the socket closes, handing every text frame to
    /// `on_text` (no parsing, no time limit): an idle connection.
    pub async fn idle(mut self, mut on_text: impl FnMut(&str)) {
        while let Some(Ok(message)) = self.socket.next().await {
            match message {
                Message::Text(text) => on_text(&text),
                Message::Close(_) => return,
                _ => {}
            }
        }
    }
}

//! A lean client of the gateway protocol v4 for load: the handshake, and
//! requests matched to their answers by id while events are counted, the
//! `chat` events of watched runs noted with their arrival time.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
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
    /// The run whose end `until_chat_end` waits for, and how it ended once
    /// its end was read: also while waiting for its ACK, since a run may end
    /// before its `chat.send` is answered.
    awaited_end: Option<(String, Option<String>)>,
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

/// The client sockets' settings: the library's defaults but a read buffer
/// of 8 KiB, not 128 KiB. The library zeroes its read buffer's spare room
/// before each read, and a fan-out makes many small reads: at 128 KiB the
/// bench spent 7% of the machine's CPU in `memset`, taken from the
/// gateway it measures.
fn socket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(8 * 1024)
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
                tokio_tungstenite::connect_async_with_config(url, Some(socket_config()), true)
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
                let stream = MaybeTlsStream::Plain(stream);
                tokio_tungstenite::client_async_with_config(url, stream, Some(socket_config()))
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
            awaited_end: None,
        };
        let challenge_name = "connect.challenge";
        let challenge = client
            .frame(
                Instant::now() + OPERATION_TIMEOUT,
                Some(challenge_name),
                |frame, text| {
                    let expected =
                        frame.is_some_and(|f| f.event.as_deref() == Some(challenge_name));
                    (!expected).then(|| text.to_owned())
                },
            )
            .await?;
        if let Some(other) = challenge {
            bail!("expected connect.challenge, got {other}");
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
        if let Err(error) = client.answer("connect").await? {
            bail!("connect refused: {error}");
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

    /// Reads the next text frame, if it comes before `deadline`, notes it
    /// if it is a watched run's `chat` event, and hands it to `read`: as it
    /// came, and parsed if its text holds `awaited` or the watched prefix.
    /// Other frames are not parsed: with every run's events going to every
    /// connection, most frames a connection reads are other runs' events,
    /// and parsing them on the machine's cores would be CPU taken from the
    /// gateway measured.
    async fn frame<T>(
        &mut self,
        deadline: Instant,
        awaited: Option<&str>,
        read: impl FnOnce(Option<&Frame>, &str) -> T,
    ) -> anyhow::Result<T> {
        loop {
            let message = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .with_context(|| format!("nothing awaited came within {OPERATION_TIMEOUT:?}"))?;
            match message {
                Some(Ok(Message::Text(text))) => {
                    let at = Instant::now();
                    let watched = self.watch.as_deref().is_some_and(|p| text.contains(p))
                        || self
                            .awaited_end
                            .as_ref()
                            .is_some_and(|(r, _)| text.contains(r));
                    if !(watched || awaited.is_some_and(|a| text.contains(a))) {
                        return Ok(read(None, &text));
                    }
                    let frame = Frame::parse(&text)?;
                    self.observe(&frame, at);
                    return Ok(read(Some(&frame), &text));
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

    fn observe(&mut self, frame: &Frame, at: Instant) {
        let Some(chat) = &frame.chat else { return };
        if let Some((run_id, ended @ None)) = &mut self.awaited_end
            && chat.run_id == run_id.as_str()
            && !matches!(&*chat.state, "delta" | "status")
        {
            *ended = Some(chat.state.to_string());
        }
        let Some(prefix) = &self.watch else { return };
        let run = chat
            .run_id
            .strip_prefix(prefix.as_str())
            .and_then(|n| n.parse::<u32>().ok());
        let Some(run) = run else { return };
        match &*chat.state {
            "delta" => self.deltas.push(Arrival {
                run,
                seq: chat.seq,
                at,
            }),
            "final" | "aborted" | "error" => self.ended += 1,
            _ => {}
        }
    }

    /// Frames until the answer to `id` (events are counted, not kept):
    /// `Ok(())`, or its `error` as JSON.
    async fn answer(&mut self, id: &str) -> anyhow::Result<Result<(), String>> {
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        loop {
            let answer = self
                .frame(deadline, Some(id), |frame, text| {
                    let frame = frame?;
                    let answers = frame.kind == "res" && frame.id.as_deref() == Some(id);
                    answers.then(|| match frame.ok {
                        Some(true) => Ok(()),
                        _ => Err(error_of(text)),
                    })
                })
                .await?;
            match answer {
                Some(answer) => return Ok(answer),
                None => self.events += 1,
            }
        }
    }

    /// Sends `method` and waits for its answer; the time it took.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Duration> {
        self.next_id += 1;
        let id = format!("b{}", self.next_id);
        let started = Instant::now();
        self.send(&json!({ "type": "req", "id": id, "method": method, "params": params }))
            .await?;
        let answer = self
            .answer(&id)
            .await
            .with_context(|| format!("waiting for the answer to {method}"))?;
        let took = started.elapsed();
        if let Err(error) = answer {
            bail!("{method} failed: {error}");
        }
        Ok(took)
    }

    /// Sends a `chat.send` whose idempotency key is `run_id` and waits for
    /// the run's end: the time to its ACK and the time to its end. The end
    /// is noted from before the send, since it may come before the ACK.
    pub async fn send_run(
        &mut self,
        run_id: &str,
        params: Value,
    ) -> anyhow::Result<(Duration, Duration)> {
        let started = Instant::now();
        self.awaited_end = Some((run_id.to_owned(), None));
        let ack = self.request("chat.send", params).await?;
        Ok((ack, self.until_chat_end(run_id, started).await?))
    }

    /// Waits for the end of `run_id`, noted since `send_run` sent it; the
    /// time from `from`.
    async fn until_chat_end(&mut self, run_id: &str, from: Instant) -> anyhow::Result<Duration> {
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        loop {
            if let Some((_, Some(state))) = &self.awaited_end {
                if state != "final" {
                    bail!("run {run_id} ended {state}");
                }
                self.awaited_end = None;
                return Ok(from.elapsed());
            }
            self.frame(deadline, Some(run_id), |_, _| ())
                .await
                .with_context(|| format!("waiting for run {run_id} to end"))?;
            self.events += 1;
        }
    }

    /// Reads frames until `runs` watched runs ended; fails when watched
    /// runs make no progress for [`OPERATION_TIMEOUT`].
    pub async fn until_ended(&mut self, runs: usize) -> anyhow::Result<()> {
        let mut deadline = Instant::now() + OPERATION_TIMEOUT;
        let mut progress = (self.ended, self.deltas.len());
        while self.ended < runs {
            self.frame(deadline, None, |_, _| ())
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

/// The parts of a frame the bench reads. Everything else is skipped, not
/// built: with every run's events fanned out to every connection, parsing
/// whole frames on the same cores would take CPU from the gateway measured.
#[derive(Debug, Default, PartialEq)]
struct Frame<'a> {
    kind: Cow<'a, str>,
    id: Option<Cow<'a, str>>,
    event: Option<Cow<'a, str>>,
    ok: Option<bool>,
    /// What a `chat` event says about its run.
    chat: Option<ChatPayload<'a>>,
}

#[derive(Debug, Deserialize, PartialEq)]
struct ChatPayload<'a> {
    #[serde(rename = "runId", borrow)]
    run_id: Cow<'a, str>,
    #[serde(borrow)]
    state: Cow<'a, str>,
    #[serde(default)]
    seq: u64,
}

impl<'a> Frame<'a> {
    fn parse(text: &'a str) -> anyhow::Result<Self> {
        #[derive(Deserialize)]
        struct Envelope<'a> {
            #[serde(rename = "type", borrow)]
            kind: Cow<'a, str>,
            #[serde(borrow, default)]
            id: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            event: Option<Cow<'a, str>>,
            #[serde(default)]
            ok: Option<bool>,
        }
        #[derive(Deserialize)]
        struct Chat<'a> {
            #[serde(borrow)]
            payload: ChatPayload<'a>,
        }
        let envelope: Envelope = serde_json::from_str(text)
            .with_context(|| format!("a frame that is not a protocol frame: {text:.200}"))?;
        let chat = match envelope.event.as_deref() {
            Some("chat") => Some(serde_json::from_str::<Chat>(text)?.payload),
            _ => None,
        };
        Ok(Self {
            kind: envelope.kind,
            id: envelope.id,
            event: envelope.event,
            ok: envelope.ok,
            chat,
        })
    }
}

/// The `error` of an answer, as JSON (read only when it failed).
fn error_of(answer: &str) -> String {
    serde_json::from_str::<Value>(answer).map_or_else(|e| e.to_string(), |v| v["error"].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_read_for_its_kind_id_event_and_chat_run() {
        let res = Frame::parse(r#"{"type":"res","id":"b1","ok":true,"payload":[1,{"a":2}]}"#);
        assert_eq!(
            res.unwrap(),
            Frame {
                kind: "res".into(),
                id: Some("b1".into()),
                ok: Some(true),
                ..Frame::default()
            }
        );
        let chat = r#"{"type":"event","event":"chat","seq":4,
            "payload":{"runId":"r\u002d1","sessionKey":"k","seq":3,"state":"delta","message":{}}}"#;
        let chat = Frame::parse(chat).unwrap();
        assert_eq!(chat.event.as_deref(), Some("chat"));
        let payload = chat.chat.unwrap();
        assert_eq!(
            (&*payload.run_id, &*payload.state, payload.seq),
            ("r-1", "delta", 3)
        );
        assert!(Frame::parse(r#"{"event":"tick"}"#).is_err());
    }
}

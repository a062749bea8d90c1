//! A lean client of the gateway protocol v4 for load, on the shared
//! protocol client (`clawgate-client`: the socket, the handshake, the
//! frames and their envelope): requests matched to their answers by id
//! while events are counted, the `chat` events of watched runs noted with
//! their arrival time.

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clawgate_client::socket::{self, next_text};
use clawgate_client::{ClientError, ClientInfo, ConnectParams, Envelope, OpenOptions, WebSocket};
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

pub use clawgate_client::socket::resolve;

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
    socket: WebSocket,
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

/// The client sockets' read buffer: 8 KiB, not the library's 128 KiB. The
/// library zeroes its read buffer's spare room before each read, and a
/// fan-out makes many small reads: at 128 KiB the bench spent 7% of the
/// machine's CPU in `memset`, taken from the gateway it measures.
const READ_BUFFER: usize = 8 * 1024;

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
        let open = OpenOptions {
            source: options.source,
            read_buffer: Some(READ_BUFFER),
            ..OpenOptions::default()
        };
        let mut socket = socket::open(url, &open)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        let mut info = ClientInfo::new("gateway-client", "backend", env!("CARGO_PKG_VERSION"));
        info.instance_id = options.instance_id.clone();
        let params = ConnectParams::operator(info, options.scopes).token(token);
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        socket::handshake(&mut socket, &params, deadline)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let client = Self {
            socket,
            next_id: 0,
            events: 0,
            watch: None,
            deltas: Vec::new(),
            ended: 0,
            awaited_end: None,
        };
        Ok((client, started.elapsed()))
    }

    /// Notes the `chat` events of runs whose runId is `prefix` + a number.
    pub fn watch(&mut self, prefix: impl Into<String>) {
        self.watch = Some(prefix.into());
    }

    async fn send(&mut self, frame: &Value) -> anyhow::Result<()> {
        socket::send_json(&mut self.socket, frame)
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
        let text = match next_text(&mut self.socket, Some(deadline), "an awaited frame").await {
            Ok(text) => text,
            Err(ClientError::TimedOut { .. }) => {
                bail!("nothing awaited came within {OPERATION_TIMEOUT:?}")
            }
            Err(other) => bail!("{other}"),
        };
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
        Ok(read(Some(&frame), &text))
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
                    frame.envelope.answers(id).then(|| match frame.envelope.ok {
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
        self.send(&clawgate_client::frame::request(&id, method, params))
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
        while let Ok(text) = next_text(&mut self.socket, None, "frames").await {
            on_text(&text);
        }
    }
}

/// The parts of a frame the bench reads: its envelope and, for a `chat`
/// event, its run. Everything else is skipped, not built: with every run's
/// events fanned out to every connection, parsing whole frames on the same
/// cores would take CPU from the gateway measured.
#[derive(Debug, Default, PartialEq)]
struct Frame<'a> {
    envelope: Envelope<'a>,
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
        struct Chat<'a> {
            #[serde(borrow)]
            payload: ChatPayload<'a>,
        }
        let envelope = Envelope::parse(text)
            .with_context(|| format!("a frame that is not a protocol frame: {text:.200}"))?;
        let chat = match envelope.event.as_deref() {
            Some("chat") => Some(serde_json::from_str::<Chat>(text)?.payload),
            _ => None,
        };
        Ok(Self { envelope, chat })
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
                envelope: Envelope {
                    kind: "res".into(),
                    id: Some("b1".into()),
                    ok: Some(true),
                    ..Envelope::default()
                },
                chat: None,
            }
        );
        let chat = r#"{"type":"event","event":"chat","seq":4,
            "payload":{"runId":"r\u002d1","sessionKey":"k","seq":3,"state":"delta","message":{}}}"#;
        let chat = Frame::parse(chat).unwrap();
        assert_eq!(chat.envelope.event.as_deref(), Some("chat"));
        let payload = chat.chat.unwrap();
        assert_eq!(
            (&*payload.run_id, &*payload.state, payload.seq),
            ("r-1", "delta", 3)
        );
        assert!(Frame::parse(r#"{"event":"tick"}"#).is_err());
    }
}

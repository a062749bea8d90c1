//! A protocol client for tests that inject faults: it reports failures
//! (closed, timed out, refused) instead of panicking, so that the caller
//! retries with the same idempotency key through whichever edge answers,
//! and it notes every run end it sees on the way.

use std::collections::HashMap;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::cluster::TOKEN;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A client connection that reports failures instead of panicking.
pub struct Conn {
    ws: Ws,
    next_id: u64,
    /// Runs whose end this connection saw, with the end's state.
    pub ends: HashMap<String, String>,
}

/// How long one request or connect may take before it counts as failed.
pub const STEP: Duration = Duration::from_secs(10);

impl Conn {
    pub async fn open(url: &str) -> Result<Self, String> {
        let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let mut conn = Self {
            ws,
            next_id: 0,
            ends: HashMap::new(),
        };
        let params = json!({
            "minProtocol": 4, "maxProtocol": 4,
            "client": { "id": "test", "version": "test", "platform": "linux", "mode": "test" },
            "auth": { "token": TOKEN }, "role": "operator",
            "scopes": ["operator.read", "operator.write"],
        });
        let hello = conn.request("connect", params).await?;
        if hello["ok"] != true {
            return Err(format!("connect refused: {hello}"));
        }
        Ok(conn)
    }

    /// Reads one frame, noting run ends.
    pub async fn frame(&mut self, deadline: Instant) -> Result<Value, String> {
        loop {
            let message = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .map_err(|_| "timed out".to_owned())?;
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Close(_))) | None => return Err("closed".into()),
                Some(Err(e)) => return Err(e.to_string()),
                Some(Ok(_)) => continue,
            };
            let frame: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let payload = &frame["payload"];
            if frame["event"] == "chat"
                && let (Some(run), Some(state)) =
                    (payload["runId"].as_str(), payload["state"].as_str())
                && matches!(state, "final" | "error" | "aborted")
            {
                self.ends.insert(run.to_owned(), state.to_owned());
            }
            return Ok(frame);
        }
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = format!("c{}", self.next_id);
        let frame = json!({ "type": "req", "id": id, "method": method, "params": params });
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + STEP;
        loop {
            let frame = self.frame(deadline).await?;
            if frame["type"] == "res" && frame["id"] == id {
                return Ok(frame);
            }
        }
    }

    /// Waits for `run_id`'s end (noted before, or still to come).
    pub async fn end_of(&mut self, run_id: &str) -> Result<String, String> {
        let deadline = Instant::now() + 2 * STEP;
        loop {
            if let Some(state) = self.ends.get(run_id) {
                return Ok(state.clone());
            }
            self.frame(deadline).await?;
        }
    }
}

/// One attempt to get `run_id` sent and ended on `conn`: its end as the
/// connection saw it, or why it must be retried.
pub async fn attempt(
    conn: &mut Conn,
    session: &str,
    run_id: &str,
    queue_mode: &str,
    acked: &mut bool,
) -> Result<String, String> {
    let answer = send(conn, session, run_id, queue_mode, acked).await?;
    match answer.as_str() {
        "accepted" => conn.end_of(run_id).await,
        _ => Ok(answer),
    }
}

/// Sends `run_id` once (`chat.send`, key = `run_id`): `Ok("accepted")`,
/// or its end when the answer already is one (`final`, `error`,
/// `aborted`), or why it must be retried.
pub async fn send(
    conn: &mut Conn,
    session: &str,
    run_id: &str,
    queue_mode: &str,
    acked: &mut bool,
) -> Result<String, String> {
    let params = json!({
        "sessionKey": session, "message": format!("turn {run_id}"),
        "idempotencyKey": run_id, "queueMode": queue_mode,
    });
    let answer = conn.request("chat.send", params).await?;
    // A retry of a run that ended in an error (lost with its coordinator,
    // say) is answered with that end.
    if answer["ok"] == false && answer["payload"]["status"] == "error" {
        *acked = true;
        return Ok("error".into());
    }
    if answer["ok"] != true {
        let code = answer["error"]["code"].as_str().unwrap_or_default();
        assert_eq!(
            code, "UNAVAILABLE",
            "{run_id}: a refusal a retry cannot fix: {answer}"
        );
        return Err(format!("refused: {answer}"));
    }
    *acked = true;
    match answer["payload"]["status"].as_str() {
        // Already over: the answer is its end.
        Some("ok") => Ok("final".into()),
        Some("error") => Ok("error".into()),
        Some("aborted") => Ok("aborted".into()),
        _ => Ok("accepted".into()),
    }
}

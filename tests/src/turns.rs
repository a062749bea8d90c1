//! A protocol client for tests that inject faults: it reports failures
//! (closed, timed out, refused) instead of panicking, so that the caller
//! retries with the same idempotency key through whichever edge answers,
//! and it notes every run end it sees on the way. The shared protocol
//! client's [`Connection`] does the protocol.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_client::{ConnectParams, Connection, OpenOptions};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{TOKEN, client_info};

/// A client connection that reports failures instead of panicking.
pub struct Conn {
    connection: Connection,
    /// Runs whose end this connection saw, with the end's state.
    pub ends: HashMap<String, String>,
}

/// How long one request or connect may take before it counts as failed.
pub const STEP: Duration = Duration::from_secs(10);

impl Conn {
    pub async fn open(url: &str) -> Result<Self, String> {
        let params = ConnectParams::operator(client_info(), &["operator.read", "operator.write"])
            .token(TOKEN);
        let deadline = Instant::now() + STEP;
        let connection = Connection::connect(url, &OpenOptions::default(), &params, deadline)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            connection,
            ends: HashMap::new(),
        })
    }

    /// Notes the end of the run `event` says ended, if it does.
    fn note(&mut self, event: &Value) {
        let payload = &event["payload"];
        if event["event"] == "chat"
            && let (Some(run), Some(state)) = (payload["runId"].as_str(), payload["state"].as_str())
            && matches!(state, "final" | "error" | "aborted")
        {
            self.ends.insert(run.to_owned(), state.to_owned());
        }
    }

    /// Sends a request; its response frame (`ok` true or false), or why
    /// there is none.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let answer = self
            .connection
            .call(method, params, Some(Instant::now() + STEP))
            .await;
        for event in self.connection.take_events() {
            self.note(&event);
        }
        Ok(answer.map_err(|e| e.to_string())?.frame)
    }

    /// Waits for `run_id`'s end (noted before, or still to come).
    pub async fn end_of(&mut self, run_id: &str) -> Result<String, String> {
        let deadline = Instant::now() + 2 * STEP;
        loop {
            if let Some(state) = self.ends.get(run_id) {
                return Ok(state.clone());
            }
            let event = self
                .connection
                .next_event(Some(deadline))
                .await
                .map_err(|e| e.to_string())?;
            self.note(&event);
        }
    }
}

/// A client's connection to one of several edges: opened on the next edge
/// in turn after a failure. The edges' URLs are shared with whoever
/// restarts them (a restarted edge has another address).
pub struct Link {
    urls: Arc<Mutex<Vec<String>>>,
    pick: usize,
    conn: Option<Conn>,
}

impl Link {
    /// A link that first tries the edge after `first` (modulo their count).
    pub fn new(urls: Arc<Mutex<Vec<String>>>, first: usize) -> Self {
        Self {
            urls,
            pick: first,
            conn: None,
        }
    }

    /// The open connection, or a new one to the next edge.
    pub async fn conn(&mut self) -> Result<&mut Conn, String> {
        if self.conn.is_none() {
            self.pick += 1;
            let url = {
                let urls = self.urls.lock().unwrap();
                urls[self.pick % urls.len()].clone()
            };
            let conn = Conn::open(&url).await.map_err(|e| format!("{url}: {e}"))?;
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("opened above"))
    }

    /// Drops the connection: the next use opens one to the next edge.
    pub fn failed(&mut self) {
        self.conn = None;
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

//! The subcommands: each is one or two requests and their printing.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::Command;
use crate::protocol::{Exit, Failure, Gateway};

/// Where results go: human text, or one JSON object per line.
pub struct Output {
    pub json: bool,
}

impl Output {
    fn line(&self, value: Value) {
        println!("{value}");
    }
}

pub async fn run(gateway: &mut Gateway, command: &Command, out: &Output) -> Result<(), Failure> {
    match command {
        Command::Send {
            message,
            session,
            key,
        } => {
            let run_id = key
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            send(gateway, out, message, session, &run_id).await
        }
        Command::Wait { run_id, timeout_ms } => wait(gateway, out, run_id, *timeout_ms).await,
        Command::Abort { session, run } => abort(gateway, out, session, run.as_deref()).await,
        Command::History { session, limit } => history(gateway, out, session, *limit).await,
        Command::Sessions { limit } => sessions(gateway, out, *limit).await,
    }
}

/// The text of a message: its text parts (or a plain string content).
fn message_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part["text"].as_str() {
                Some(text) => text.to_owned(),
                None => format!("[{}]", part["type"].as_str().unwrap_or("?")),
            })
            .collect(),
        _ => String::new(),
    }
}

async fn send(
    gateway: &mut Gateway,
    out: &Output,
    message: &str,
    session: &str,
    run_id: &str,
) -> Result<(), Failure> {
    let params = json!({ "sessionKey": session, "message": message, "idempotencyKey": run_id });
    let response = gateway.call("chat.send", params).await?;
    if !response.ok() {
        // A run that already ended in error answers with its status too.
        let exit = if response.payload()["status"] == "error" {
            Exit::RunError
        } else {
            Exit::Request
        };
        return Err(Failure::from_error(
            exit,
            response.error().unwrap_or(&json!({})),
        ));
    }
    let status = response.payload()["status"].as_str().unwrap_or("started");
    if out.json {
        out.line(json!({ "type": "ack", "runId": run_id, "status": status }));
    }
    if status == "ok" {
        // The key was used before and that run is over: nothing to stream.
        if !out.json {
            eprintln!("run {run_id}: ok (already finished)");
        }
        return Ok(());
    }
    follow(gateway, out, run_id).await
}

/// Streams one run's reply from its events until the terminal `chat` event.
async fn follow(gateway: &mut Gateway, out: &Output, run_id: &str) -> Result<(), Failure> {
    let mut printer = Printer {
        out,
        run_id,
        printed: String::new(),
    };
    // The lifecycle end, in case the connection ends before the chat event.
    let mut lifecycle_end: Option<Value> = None;
    loop {
        let event = match gateway.next_event().await {
            Ok(event) => event,
            Err(failure) if failure.timed_out => {
                printer.end_line();
                return Err(Failure::new(
                    Exit::WaitTimeout,
                    format!("run {run_id} did not finish in time"),
                ));
            }
            Err(failure) => {
                printer.end_line();
                return match lifecycle_end {
                    Some(data) => lifecycle_outcome(run_id, &data),
                    None => Err(failure),
                };
            }
        };
        let payload = &event["payload"];
        if payload["runId"] != run_id {
            continue;
        }
        match event["event"].as_str() {
            Some("chat") => match payload["state"].as_str() {
                Some("delta") => printer.delta(payload),
                Some(state @ ("final" | "aborted" | "error")) => {
                    return printer.finish(state, payload);
                }
                // `status` phases and anything newer: nothing to show.
                _ => {}
            },
            // Assistant text comes through the chat deltas; only the
            // lifecycle is worth reporting.
            Some("agent") if payload["stream"] == "lifecycle" => {
                let data = &payload["data"];
                if out.json {
                    out.line(json!({ "type": "lifecycle", "runId": run_id, "data": data }));
                }
                if matches!(data["phase"].as_str(), Some("end" | "error")) {
                    lifecycle_end = Some(data.clone());
                }
            }
            _ => {}
        }
    }
}

/// How a run ended, from its `agent` lifecycle `end`/`error` data.
fn lifecycle_outcome(run_id: &str, data: &Value) -> Result<(), Failure> {
    if data["phase"] == "error" || data["status"] == "error" {
        let error = data["error"].as_str().unwrap_or("unknown error");
        return Err(Failure::new(
            Exit::RunError,
            format!("run {run_id} failed: {error}"),
        ));
    }
    if data["aborted"] == true || data["status"] == "timeout" {
        let reason = data["stopReason"].as_str().unwrap_or("aborted");
        return Err(Failure::new(
            Exit::Aborted,
            format!("run {run_id} aborted ({reason})"),
        ));
    }
    Ok(())
}

/// Prints a streaming reply: only what is new each time, so dropped deltas
/// or a final text longer than the deltas still print exactly once.
struct Printer<'a> {
    out: &'a Output,
    run_id: &'a str,
    /// The reply text printed so far.
    printed: String,
}

impl Printer<'_> {
    fn delta(&mut self, payload: &Value) {
        let delta = payload["deltaText"].as_str().unwrap_or("");
        let replace = payload["replace"] == true;
        if self.out.json {
            let mut line = json!({ "type": "delta", "runId": self.run_id, "text": delta });
            if replace {
                line["replace"] = json!(true);
            }
            self.out.line(line);
        }
        // `message` is the cumulative text; without it, build it.
        let full = if payload["message"].is_object() {
            message_text(&payload["message"])
        } else if replace {
            delta.to_owned()
        } else {
            format!("{}{delta}", self.printed)
        };
        self.show(full);
    }

    /// Prints the part of `full` not printed yet (all of it, on a new
    /// line, when it does not continue what was printed).
    fn show(&mut self, full: String) {
        if self.out.json || full == self.printed {
            self.printed = full;
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let _ = match full.strip_prefix(self.printed.as_str()) {
            Some(rest) => write!(stdout, "{rest}"),
            None => write!(stdout, "\n{full}"),
        };
        let _ = stdout.flush();
        self.printed = full;
    }

    fn end_line(&self) {
        if !self.out.json && !self.printed.is_empty() {
            println!();
        }
    }

    /// The terminal chat event: print the rest, the status, and the outcome.
    fn finish(mut self, state: &str, payload: &Value) -> Result<(), Failure> {
        if payload["message"].is_object() {
            self.show(message_text(&payload["message"]));
        }
        self.end_line();
        let stop_reason = payload["stopReason"].as_str();
        let error_message = payload["errorMessage"].as_str().unwrap_or("unknown error");
        if self.out.json {
            let mut line = json!({
                "type": "final", "runId": self.run_id, "state": state, "text": self.printed,
            });
            if let Some(reason) = stop_reason {
                line["stopReason"] = json!(reason);
            }
            if state == "error" {
                line["errorMessage"] = json!(error_message);
            }
            self.out.line(line);
        }
        match state {
            "final" => {
                if !self.out.json {
                    eprintln!("run {}: ok", self.run_id);
                }
                Ok(())
            }
            "aborted" => Err(Failure::new(
                Exit::Aborted,
                format!(
                    "run {} aborted ({})",
                    self.run_id,
                    stop_reason.unwrap_or("aborted")
                ),
            )),
            _ => {
                let kind = payload["errorKind"]
                    .as_str()
                    .map(|k| format!(" [{k}]"))
                    .unwrap_or_default();
                Err(Failure::new(
                    Exit::RunError,
                    format!("run {} failed: {error_message}{kind}", self.run_id),
                ))
            }
        }
    }
}

async fn wait(
    gateway: &mut Gateway,
    out: &Output,
    run_id: &str,
    timeout_ms: u64,
) -> Result<(), Failure> {
    let params = json!({ "runId": run_id, "timeoutMs": timeout_ms });
    let payload = match gateway.request("agent.wait", params).await {
        Ok(payload) => payload,
        Err(failure) if failure.timed_out => {
            return Err(Failure::new(
                Exit::WaitTimeout,
                format!("run {run_id} has not finished (gave up waiting)"),
            ));
        }
        Err(failure) => return Err(failure),
    };
    if out.json {
        out.line(payload.clone());
    }
    let error = payload["error"].as_str().unwrap_or("unknown error");
    match payload["status"].as_str() {
        Some("ok") => {
            if !out.json {
                println!("run {run_id}: ok");
            }
            Ok(())
        }
        // A timeout with an end time is a run that timed out; without one,
        // the wait timed out and the run is still going (or unknown).
        Some("timeout") if payload.get("endedAt").is_some() => Err(Failure::new(
            Exit::Aborted,
            format!("run {run_id} timed out"),
        )),
        Some("timeout") => Err(Failure::new(
            Exit::WaitTimeout,
            format!("run {run_id} has not finished after {timeout_ms} ms"),
        )),
        Some("error") if error == "aborted" => {
            Err(Failure::new(Exit::Aborted, format!("run {run_id} aborted")))
        }
        Some("error") => Err(Failure::new(
            Exit::RunError,
            format!("run {run_id} failed: {error}"),
        )),
        _ => Err(Failure::new(
            Exit::Request,
            format!("unexpected agent.wait answer: {payload}"),
        )),
    }
}

async fn abort(
    gateway: &mut Gateway,
    out: &Output,
    session: &str,
    run_id: Option<&str>,
) -> Result<(), Failure> {
    let mut params = json!({ "sessionKey": session });
    if let Some(run_id) = run_id {
        params["runId"] = json!(run_id);
    }
    let payload = gateway.request("chat.abort", params).await?;
    if out.json {
        out.line(payload);
    } else if payload["aborted"] == true {
        let ids: Vec<&str> = payload["runIds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!("aborted: {}", ids.join(", "));
    } else {
        println!("nothing to abort");
    }
    Ok(())
}

async fn history(
    gateway: &mut Gateway,
    out: &Output,
    session: &str,
    limit: Option<u32>,
) -> Result<(), Failure> {
    let mut params = json!({ "sessionKey": session });
    if let Some(limit) = limit {
        params["limit"] = json!(limit);
    }
    let payload = gateway.request("chat.history", params).await?;
    if out.json {
        out.line(payload);
        return Ok(());
    }
    let messages = payload["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if messages.is_empty() {
        eprintln!("(no messages)");
    }
    for message in messages {
        let role = message["role"].as_str().unwrap_or("?");
        let aborted = if message["aborted"] == true {
            " (aborted)"
        } else {
            ""
        };
        println!("{role}{aborted}: {}", message_text(message));
    }
    Ok(())
}

/// `12s ago`, `5m ago`, … for a millisecond timestamp.
fn age(updated_at_ms: Option<i64>) -> String {
    let Some(then) = updated_at_ms else {
        return "-".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let seconds = (now - then).max(0) / 1000;
    match seconds {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

async fn sessions(gateway: &mut Gateway, out: &Output, limit: Option<u32>) -> Result<(), Failure> {
    let mut params = json!({});
    if let Some(limit) = limit {
        params["limit"] = json!(limit);
    }
    let payload = gateway.request("sessions.list", params).await?;
    if out.json {
        out.line(payload);
        return Ok(());
    }
    let rows = payload["sessions"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if rows.is_empty() {
        eprintln!("(no sessions)");
    }
    let width = rows
        .iter()
        .filter_map(|r| r["key"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    for row in rows {
        let key = row["key"].as_str().unwrap_or("?");
        let status = row["status"].as_str().unwrap_or("-");
        let label = row["label"].as_str().unwrap_or("");
        let line = format!(
            "{key:width$}  {status:7}  {:>8}  {label}",
            age(row["updatedAt"].as_i64())
        );
        println!("{}", line.trim_end());
    }
    Ok(())
}

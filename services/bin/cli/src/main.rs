//! `clawgate-cli`: a command-line client for the clawgate gateway edge
//! (OpenClaw gateway protocol v4 over WebSocket).
//!
//! ```text
//! clawgate-cli [--url ws://host:port] [--token T | --password P] [--scopes a,b]
//!              [--json] [--timeout SECONDS] <command>
//!   send <message> [--session main] [--key K]   chat.send, streams the reply
//!   wait <runId> [--timeout-ms N]               agent.wait
//!   abort <session> [--run <runId>]             chat.abort
//!   history <session> [--limit N]               chat.history
//!   sessions [--limit N]                        sessions.list
//! ```
//!
//! Exit codes:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 2 | usage error |
//! | 3 | could not connect, connection lost, or no answer in time |
//! | 4 | connect rejected by the gateway (authentication, handshake) |
//! | 5 | a request got an error response |
//! | 6 | the run ended aborted or timed out |
//! | 7 | the run ended in error |
//! | 8 | waiting for the run gave up before it finished |
//!
//! With `--json` every line on stdout is one JSON object; a failure ends
//! with `{"type":"error","exitCode":…,"message":…}`. Without it, replies go
//! to stdout and statuses and errors to stderr.

mod commands;
mod protocol;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::json;

use crate::commands::Output;
use crate::protocol::{ConnectOptions, Failure, Gateway};

const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  2  usage error
  3  could not connect, connection lost, or no answer in time
  4  connect rejected by the gateway (authentication, handshake)
  5  a request got an error response
  6  the run ended aborted or timed out
  7  the run ended in error
  8  waiting for the run gave up before it finished (run not finished)";

#[derive(Debug, Parser)]
#[command(name = "clawgate-cli", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// The gateway's WebSocket URL.
    #[arg(
        long,
        env = "CLAWGATE_URL",
        default_value = "ws://127.0.0.1:18789",
        value_parser = websocket_url,
        global = true
    )]
    url: String,
    /// Shared gateway token (auth.token).
    #[arg(long, env = "CLAWGATE_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Shared gateway password (auth.password).
    #[arg(long, env = "CLAWGATE_PASSWORD", hide_env_values = true, global = true)]
    password: Option<String>,
    /// Operator scopes to ask for, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "operator.read,operator.write,operator.admin",
        global = true
    )]
    scopes: Vec<String>,
    /// Print machine-readable JSON lines instead of human text.
    #[arg(long, global = true)]
    json: bool,
    /// Give up after this many seconds (exit 3, or 8 while waiting for a run).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..), global = true)]
    timeout: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send a message (chat.send) and print the reply as it streams, until the run ends.
    Send {
        /// The message to send.
        message: String,
        /// Session key.
        #[arg(long, default_value = "main")]
        session: String,
        /// Idempotency key, which is also the run id (default: a fresh UUID).
        #[arg(long)]
        key: Option<String>,
    },
    /// Wait for a run to finish (agent.wait).
    Wait {
        /// The run id (the idempotency key it was sent with).
        run_id: String,
        /// How long the gateway waits before answering "not finished".
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
    },
    /// Abort the active runs of a session, or one run (chat.abort).
    Abort {
        /// Session key.
        session: String,
        /// Only this run.
        #[arg(long = "run", value_name = "RUN_ID")]
        run: Option<String>,
    },
    /// Print a session's transcript as `role: text` lines (chat.history).
    History {
        /// Session key.
        session: String,
        /// The last N messages (1..=1000; the gateway's default is 200).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
    },
    /// List sessions (sessions.list).
    Sessions {
        /// At most N sessions (1..=1000; the gateway's default is 100).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
    },
}

fn websocket_url(raw: &str) -> Result<String, String> {
    if raw.starts_with("ws://") && raw.len() > "ws://".len() {
        Ok(raw.to_owned())
    } else if raw.starts_with("wss://") {
        Err("wss:// is not supported by this build; use ws://".into())
    } else {
        Err("expected a ws:// URL".into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Parse errors exit with 2, --help and --version with 0.
    let cli = Cli::parse();
    let out = Output { json: cli.json };
    match run(&cli, &out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            report(&out, &failure);
            ExitCode::from(failure.exit as u8)
        }
    }
}

async fn run(cli: &Cli, out: &Output) -> Result<(), Failure> {
    let deadline = cli
        .timeout
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let options = ConnectOptions {
        url: cli.url.clone(),
        token: cli.token.clone(),
        password: cli.password.clone(),
        scopes: cli.scopes.clone(),
    };
    let mut gateway = Gateway::connect(&options, deadline).await?;
    let result = commands::run(&mut gateway, &cli.command, out).await;
    gateway.close().await;
    result
}

fn report(out: &Output, failure: &Failure) {
    if out.json {
        let mut line = json!({
            "type": "error",
            "exitCode": failure.exit as u8,
            "message": failure.message,
        });
        if let Some(code) = &failure.code {
            line["code"] = json!(code);
        }
        if let Some(details) = &failure.details {
            line["details"] = details.clone();
        }
        println!("{line}");
    } else {
        eprintln!("clawgate-cli: {failure}");
    }
}

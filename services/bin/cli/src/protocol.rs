//! The CLI's connection to the gateway: the shared protocol client
//! (`clawgate-client`: challenge → connect → hello-ok, requests answered by
//! id, the events that arrive meanwhile queued, so a caller reading the
//! event stream afterwards misses none of them), its failures turned into
//! the CLI's exit codes.

use std::fmt;
use std::time::Duration;

use clawgate_client::{ClientError, ClientInfo, ConnectParams, Connection, OpenOptions};
use serde_json::{Value, json};
use tokio::time::Instant;

pub use clawgate_client::Response;

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

    /// A failure of the connection: the gateway refused `connect`
    /// ([`Exit::Auth`]), or could not be reached, closed, failed or did not
    /// answer in time ([`Exit::Connection`]).
    fn of_connection(error: ClientError) -> Self {
        match error {
            ClientError::Rejected { error } => Self::from_error(Exit::Auth, &error),
            other => Self {
                timed_out: other.timed_out(),
                ..Self::new(Exit::Connection, other.to_string())
            },
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

/// An authenticated connection to the gateway.
pub struct Gateway {
    connection: Connection,
    /// When the whole command must be done (`--timeout`).
    deadline: Option<Instant>,
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
        let client = ClientInfo::new("cli", "cli", env!("CARGO_PKG_VERSION"));
        let mut params = ConnectParams::operator(client, &options.scopes);
        params.token = options.token.clone();
        params.password = options.password.clone();
        let connection = Connection::connect(
            &options.url,
            &OpenOptions::default(),
            &params,
            handshake_deadline,
        )
        .await
        .map_err(Failure::of_connection)?;
        Ok(Self {
            connection,
            deadline,
        })
    }

    /// Sends a request and returns its (first) response, whatever it says.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Response, Failure> {
        self.connection
            .call(method, params, self.deadline)
            .await
            .map_err(Failure::of_connection)
    }

    /// Sends a request; its payload on success, a `Request` failure otherwise.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, Failure> {
        let response = self.call(method, params).await?;
        if response.ok() {
            return Ok(response.payload().clone());
        }
        let error = response.error().cloned().unwrap_or_else(|| json!({}));
        Err(Failure::from_error(Exit::Request, &error))
    }

    /// The next event frame (`{type:"event", event, payload, seq?}`).
    pub async fn next_event(&mut self) -> Result<Value, Failure> {
        self.connection
            .next_event(self.deadline)
            .await
            .map_err(Failure::of_connection)
    }

    /// Closes the socket politely (best effort).
    pub async fn close(self) {
        self.connection.close().await;
    }
}

//! Why a client operation did not succeed.

use std::fmt;

use serde_json::Value;

/// A close frame the gateway sent: its code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub code: u16,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub enum ClientError {
    /// The socket could not be opened (a bad URL, nothing listening, a
    /// failed TLS or WebSocket handshake).
    Unreachable { url: String, reason: String },
    /// The gateway answered the upgrade request with an HTTP error.
    UpgradeRefused { status: u16, body: String },
    /// A deadline passed while waiting for `what`.
    TimedOut { what: String },
    /// The gateway closed the socket, with a close frame or without one.
    Closed(Option<Close>),
    /// The connection failed, or ended without a close (`None`: it just
    /// ended).
    Lost(Option<String>),
    /// The first frame was not the `connect.challenge` event.
    NoChallenge { first: Value },
    /// The gateway answered `connect` with an error: its `ErrorShape`.
    Rejected { error: Value },
}

impl ClientError {
    /// Whether a deadline passed (rather than the gateway answering or
    /// closing).
    pub fn timed_out(&self) -> bool {
        matches!(self, Self::TimedOut { .. })
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable { url, reason } => write!(f, "cannot connect to {url}: {reason}"),
            Self::UpgradeRefused { status, body } => {
                write!(f, "the upgrade was refused: HTTP {status} {body:?}")
            }
            Self::TimedOut { what } => write!(f, "timed out waiting for {what}"),
            Self::Closed(None) => f.write_str("the gateway closed the connection"),
            Self::Closed(Some(close)) => write!(
                f,
                "the gateway closed the connection ({} {})",
                close.code, close.reason
            ),
            Self::Lost(Some(reason)) => write!(f, "connection lost: {reason}"),
            Self::Lost(None) => f.write_str("connection lost"),
            Self::NoChallenge { .. } => {
                f.write_str("the gateway did not send connect.challenge first")
            }
            Self::Rejected { error } => write!(f, "connect refused: {error}"),
        }
    }
}

impl std::error::Error for ClientError {}

//! A run's status, as the store records it and the coordinator reports it:
//! one type on both sides of that boundary (and on the wire, the store's
//! `RunStatus` enum, which the coordinator's protocol reuses).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
/// Where a run is in its life; the last six are terminal.
pub enum RunStatus {
    Accepted,
    Queued,
    Running,
    Ok,
    Error,
    Aborted,
    Timeout,
    Superseded,
    Lost,
}

impl RunStatus {
    pub const ALL: [RunStatus; 9] = [
        Self::Accepted,
        Self::Queued,
        Self::Running,
        Self::Ok,
        Self::Error,
        Self::Aborted,
        Self::Timeout,
        Self::Superseded,
        Self::Lost,
    ];

    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Accepted | Self::Queued | Self::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Aborted => "aborted",
            Self::Timeout => "timeout",
            Self::Superseded => "superseded",
            Self::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

//! The one error type of the coordinator, as its server refuses and as its
//! callers hear it; `grpc::status` maps it to status codes and back in one
//! place.

use session_store_api::{Invalid, StoreError};

use crate::model::RunSnapshot;

pub type CoordinatorResult<T> = Result<T, CoordinatorError>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordinatorError {
    #[error("{0}")]
    InvalidArgument(String),
    /// The idempotency key was used before with a different request.
    #[error("idempotency key {:?} was already used with a different payload", existing.run_id)]
    KeyReused { existing: Box<RunSnapshot> },
    /// Queue mode `reject` and the session has a run active or queued.
    #[error("session {} is busy with run {}", blocking.session_key, blocking.run_id)]
    SessionBusy { blocking: Box<RunSnapshot> },
    #[error("the coordinator is shutting down and admits no new runs")]
    Draining,
    /// This instance does not own the session's partition: a standby, or an
    /// instance whose tenure ended. `leader` is where the owner serves.
    #[error("{message}")]
    NotOwner {
        message: String,
        leader: Option<String>,
    },
    /// The session's settings are not those the request was made from.
    #[error("{0}")]
    SettingsChanged(String),
    #[error("session store unavailable: {0}")]
    StoreUnavailable(String),
    /// The coordinator's queue of runs not yet started is full (by count
    /// or bytes): nothing was admitted.
    #[error("{0}")]
    QueueFull(String),
    /// No coordinator answered (the transport failed, or the call timed
    /// out): the call may be retried. A caller's view only; no server sends it.
    #[error("run coordinator unavailable: {0}")]
    Unavailable(String),
    /// The request is over a gRPC message limit on its way (a deployment
    /// whose limits disagree, docs/limits.md). A caller's view only.
    #[error("{0}")]
    TooLarge(String),
    /// The server's auth layer knew no token of the caller's (a caller's
    /// view of `UNAUTHENTICATED`; docs/security.md).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's kind, or its session binding, does not allow the call
    /// (a caller's view of `PERMISSION_DENIED`; docs/security.md).
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Internal(String),
}

impl CoordinatorError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument(message.into())
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "INVALID_ARGUMENT",
            Self::KeyReused { .. } => "KEY_REUSED",
            Self::SessionBusy { .. } => "SESSION_BUSY",
            Self::Draining => "DRAINING",
            Self::NotOwner { .. } => "NOT_OWNER",
            Self::SettingsChanged(_) => "SETTINGS_CHANGED",
            Self::StoreUnavailable(_) => "STORE_UNAVAILABLE",
            Self::QueueFull(_) => "QUEUE_FULL",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::TooLarge(_) => "TOO_LARGE",
            Self::Unauthenticated(_) => "UNAUTHENTICATED",
            Self::PermissionDenied(_) => "PERMISSION_DENIED",
            Self::Internal(_) => "INTERNAL",
        }
    }

    /// Where the owner of the session's partition serves, when a
    /// coordinator that is not it said so.
    pub fn leader_hint(&self) -> Option<&str> {
        match self {
            Self::NotOwner {
                leader: Some(leader),
                ..
            } if !leader.is_empty() => Some(leader),
            _ => None,
        }
    }

    /// Whether the same call may succeed later or elsewhere, unchanged
    /// (nothing was decided: no coordinator admitted or refused it for
    /// what it asks).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Draining
                | Self::NotOwner { .. }
                | Self::StoreUnavailable(_)
                | Self::QueueFull(_)
                | Self::Unavailable(_)
        )
    }
}

impl From<Invalid> for CoordinatorError {
    fn from(invalid: Invalid) -> Self {
        Self::InvalidArgument(invalid.0)
    }
}

impl From<StoreError> for CoordinatorError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::InvalidArgument(message) => Self::InvalidArgument(message),
            StoreError::Unavailable(message) => Self::StoreUnavailable(message),
            StoreError::SettingsChanged(message) => Self::SettingsChanged(message),
            StoreError::StaleOwner { message, current } => Self::NotOwner {
                message: format!("this coordinator no longer owns the partition: {message}"),
                leader: current
                    .map(|lease| lease.address)
                    .filter(|address| !address.is_empty()),
            },
            other => Self::Internal(format!("session store: {other}")),
        }
    }
}

//! The one error type of the session store. The gRPC adapter maps it to status
//! codes in `grpc::status`; the remote client maps it back, losslessly.

use crate::invalid::Invalid;
use crate::model::{Lease, RunRecord, Session};

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    InvalidArgument(String),
    /// The caller does not hold the writer slot (anymore), or its fence is old.
    #[error("{message}")]
    StaleWriter {
        message: String,
        current: Option<Box<Session>>,
    },
    /// The sessionId the caller expected is no longer the key's sessionId.
    #[error("{message}")]
    SessionReplaced {
        message: String,
        current: Option<Box<Session>>,
    },
    /// A CAS AcquireWriter found another writer than the one expected.
    #[error("{message}")]
    WriterConflict {
        message: String,
        current: Option<Box<Session>>,
    },
    /// The owner token of a write is not the partition's current one: another
    /// member took the partition (or this one released it).
    #[error("{message}")]
    StaleOwner {
        message: String,
        current: Option<Box<Lease>>,
    },
    /// CreateRun's `expected_settings` is not the digest of the session's
    /// settings now, or the session is gone.
    #[error("{0}")]
    SettingsChanged(String),
    #[error("run {0:?} not found")]
    RunNotFound(String),
    #[error("run version conflict: expected version {expected}, the record is at {}", current.version)]
    RunVersionConflict {
        expected: u64,
        current: Box<RunRecord>,
    },
    #[error("run {} is terminal ({}) and cannot change", current.run_id, current.status.as_str())]
    RunTerminal { current: Box<RunRecord> },
    /// The backend cannot be reached right now; the call may be retried.
    #[error("{0}")]
    Unavailable(String),
    /// The server's auth layer knew no token of the caller's (a caller's
    /// view of `UNAUTHENTICATED`; docs/security.md).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's kind may not make the call (a caller's view of
    /// `PERMISSION_DENIED`; docs/security.md).
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Internal(String),
}

impl From<Invalid> for StoreError {
    fn from(invalid: Invalid) -> Self {
        Self::InvalidArgument(invalid.0)
    }
}

impl StoreError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument(message.into())
    }

    pub fn internal(err: impl std::fmt::Display) -> Self {
        Self::Internal(err.to_string())
    }

    /// The machine-readable code carried on the wire.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "INVALID_ARGUMENT",
            Self::StaleWriter { .. } => "STALE_WRITER",
            Self::SessionReplaced { .. } => "SESSION_REPLACED",
            Self::WriterConflict { .. } => "WRITER_CONFLICT",
            Self::StaleOwner { .. } => "STALE_OWNER",
            Self::SettingsChanged(_) => "SETTINGS_CHANGED",
            Self::RunNotFound(_) => "RUN_NOT_FOUND",
            Self::RunVersionConflict { .. } => "RUN_VERSION_CONFLICT",
            Self::RunTerminal { .. } => "RUN_TERMINAL",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::Unauthenticated(_) => "UNAUTHENTICATED",
            Self::PermissionDenied(_) => "PERMISSION_DENIED",
            Self::Internal(_) => "INTERNAL",
        }
    }

    /// The partition's lease as the store saw it when it refused a stale owner.
    pub fn current_lease(&self) -> Option<&Lease> {
        match self {
            Self::StaleOwner { current, .. } => current.as_deref(),
            _ => None,
        }
    }

    /// The session as the store saw it when it refused, for fence errors.
    pub fn current_session(&self) -> Option<&Session> {
        match self {
            Self::StaleWriter { current, .. }
            | Self::SessionReplaced { current, .. }
            | Self::WriterConflict { current, .. } => current.as_deref(),
            _ => None,
        }
    }
}

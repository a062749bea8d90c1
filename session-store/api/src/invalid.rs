//! The refusal of an argument that breaks the store's rules (a session key,
//! a run id, a session id), below the model and the error type so both can
//! use it: `StoreError::InvalidArgument` is made from it.

/// Why an argument was refused, in words for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Invalid {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

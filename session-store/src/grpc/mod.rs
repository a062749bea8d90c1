//! The gRPC face of the store: the server adapter here; the remote client,
//! the conversions and the error mapping live in the API crate and are
//! re-exported under the same paths.

pub mod access;
pub mod service;

pub use session_store_api::grpc::{MAX_MESSAGE_BYTES, client, convert, status};

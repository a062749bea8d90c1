//! The gRPC face of the store: the server adapter, the remote client, and the
//! one place where errors become status codes.

pub mod client;
pub mod convert;
pub mod service;
pub mod status;

/// Largest gRPC message either side accepts. A History page is bounded by
/// `Limits::max_history_chars`, well below this.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

//! The store's wire: the remote client, the conversions, and the one place
//! where errors become status codes and back.

pub mod client;
pub mod convert;
pub mod status;

/// Largest gRPC message the client accepts and sends, and the server's
/// default (`--grpc-max-message-bytes`); see `clawgate_common::limits`.
pub const MAX_MESSAGE_BYTES: usize = clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES;

//! The coordinator's gRPC face: the tonic adapter and the one place where
//! errors become status codes.

pub mod convert;
pub mod service;
pub mod status;

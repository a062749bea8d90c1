//! The coordinator's gRPC face: the tonic adapter, who may call what
//! (`access`) and on which sessions (`scope`). The conversions and the one
//! mapping between errors and status codes are the API crate's
//! (`run_coordinator_api::grpc`), shared with the clients.

pub mod access;
pub mod scope;
pub mod service;

//! The coordinator's wire, shared by its server and its clients: the
//! conversions between the domain and protobuf, and the one mapping between
//! errors and status codes.

pub mod convert;
pub mod status;

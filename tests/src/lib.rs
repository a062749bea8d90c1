//! Shared by the system tests: the real binaries as a cluster of child
//! processes ([`cluster`]), a client of the edge's WebSocket protocol
//! ([`client`]), an in-process OTLP trace receiver ([`receiver`]) and the
//! services' span contract as checks over received spans ([`contract`]),
//! and a descriptor-driven gRPC fuzzer every service's tests use
//! ([`proto_fuzz`]).

pub mod client;
pub mod cluster;
pub mod contract;
pub mod proto_fuzz;
pub mod receiver;

pub use client::EdgeClient;
pub use cluster::{Cluster, ClusterBuilder, Role};
pub use receiver::{AttrValue, ExportedSpan, SpanKind, Spans, TraceReceiver};

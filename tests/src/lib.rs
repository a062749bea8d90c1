//! Shared by the system tests: the real binaries as a cluster of child
//! processes ([`cluster`]), a client of the edge's WebSocket protocol
//! ([`client`]), an in-process OTLP trace receiver ([`receiver`]), the
//! services' span contract as checks over received spans ([`contract`]) and
//! gRPC server reflection in both versions ([`reflection`]).

pub mod client;
pub mod cluster;
pub mod contract;
pub mod process;
pub mod receiver;
pub mod reflection;

pub use client::EdgeClient;
pub use cluster::{Cluster, ClusterBuilder, Role};
pub use receiver::{AttrValue, ExportedSpan, SpanKind, Spans, TraceReceiver};

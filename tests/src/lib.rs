//! Shared by the system tests: the real binaries as a cluster of child
//! processes ([`cluster`]), a client of the edge's WebSocket protocol
//! ([`client`]) and an in-process OTLP trace receiver ([`receiver`]).

pub mod client;
pub mod cluster;
pub mod receiver;

pub use client::EdgeClient;
pub use cluster::{Cluster, ClusterBuilder, Role};
pub use receiver::{AttrValue, ExportedSpan, SpanKind, Spans, TraceReceiver};

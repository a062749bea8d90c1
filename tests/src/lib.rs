//! Shared by the system tests: the real binaries as a cluster of child
//! processes ([`cluster`], each started through [`process`]), a client of the
//! edge's WebSocket protocol ([`client`]), an in-process OTLP trace receiver
//! ([`receiver`]), the store and the coordinator in this process on port 0
//! ([`local`]), an agent runtime service counting executions ([`runtime`]), the services' span contract as checks over received spans
//! ([`contract`]), gRPC server reflection in both versions ([`reflection`]),
//! and a descriptor-driven gRPC fuzzer every service's tests use
//! ([`proto_fuzz`]).

pub mod balancer;
pub mod client;
pub mod cluster;
pub mod contract;
pub mod fault_proxy;
pub mod fuzz_seeds;
pub mod ha;
pub mod kube;
pub mod local;
pub mod process;
pub mod proto_fuzz;
pub mod receiver;
pub mod records;
pub mod reflection;
pub mod rng;
pub mod runtime;
pub mod slot;
pub mod transcript;
pub mod turns;

pub use client::EdgeClient;
pub use cluster::{Cluster, ClusterBuilder, Role};
pub use receiver::{AttrValue, ExportedSpan, SpanKind, Spans, TraceReceiver};

/// Prints a figure a test measured, past the test harness's output capture
/// (which takes `println!`), so that it shows in every run's log, `.ci/run`'s
/// included.
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

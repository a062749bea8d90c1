//! The test kit every crate's tests use: one way to wait
//! ([`wait::wait_for`]), the tests' PostgreSQL ([`postgres::postgres_url`]),
//! the services in this process on port 0 ([`sandbox::Sandbox`]), the real
//! binaries as child processes ([`system::System`], each started through
//! [`process`]), the tests' client of the edge's WebSocket protocol
//! ([`client::Client`], on the shared `clawgate-client`) and raw TCP
//! sockets that speak no protocol ([`raw_socket`]), and what the
//! system tests build on: an in-process OTLP trace receiver ([`receiver`])
//! and the services' span contract over its spans ([`contract`]), an agent
//! runtime service counting executions ([`runtime`]), fault-injecting and
//! balancing TCP proxies ([`fault_proxy`], [`balancer`]), a client that
//! reports failures for retrying ([`turns`]), raw gRPC clients calling
//! with a service token ([`bearer`]), gRPC server reflection in
//! both versions ([`reflection`]), and a descriptor-driven gRPC fuzzer
//! ([`proto_fuzz`]).

pub mod balancer;
pub mod bearer;
pub mod client;
pub mod contract;
pub mod fault_proxy;
pub mod fuzz_seeds;
pub mod journal;
pub mod kube;
pub mod openai_stub;
pub mod pg_cluster;
pub mod postgres;
pub mod process;
pub mod proto_fuzz;
pub mod raw_socket;
pub mod receiver;
pub mod records;
pub mod reflection;
pub mod rng;
pub mod runtime;
pub mod sandbox;
pub mod system;
pub mod transcript;
pub mod turns;
pub mod wait;

pub use client::Client;
pub use postgres::postgres_url;
pub use receiver::{AttrValue, ExportedSpan, SpanKind, Spans, TraceReceiver};
pub use sandbox::Sandbox;
pub use system::{Role, System, SystemBuilder};
pub use wait::{wait_for, wait_until};

/// Prints a figure a test measured, past the test harness's output capture
/// (which takes `println!`), so that it shows in every run's log, `.ci/run`'s
/// included.
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

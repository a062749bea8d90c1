//! The gateway edge: the OpenClaw gateway protocol v4 over WebSocket,
//! translated into gRPC calls to the run coordinator and the session store.
//!
//! The crate is in layers, each a folder, each using only those below it
//! (`tests/tests/module_graph.rs` holds it to that):
//!
//! - `protocol` — the wire: frames, closed params, the JSON depth bound,
//!   transcript entries as protocol messages;
//! - `config` — the flags;
//! - `auth` — who may connect and call what: the `connect` params, shared
//!   secrets, device identity and tokens, roles and scopes;
//! - `state` — what the process shares: the edge (backends, the connection
//!   registry), a connection and its outbox, caches, limits, metrics;
//! - `events` — what flows to clients unasked: the coordinators' event
//!   streams (fan-in), their delivery (fan-out), the session feed, presence;
//! - `methods` — the method table and one file per method family;
//! - `transport` — the HTTP listener, a socket's life (challenge, connect,
//!   the serving loop), pre-auth I/O, write coalescing, client addresses,
//!   the Control UI's files.
//!
//! `fuzzing` (behind the `fuzzing` feature) is the fuzz targets' harness.

pub mod auth;
pub mod config;
pub mod events;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod methods;
pub mod protocol;
pub mod state;
pub mod transport;

pub use config::EdgeConfig;
pub use state::{Backends, Edge};
pub use transport::server::{serve, serve_edge, serve_with_metrics};

//! The gateway edge: the OpenClaw gateway protocol v4 over WebSocket,
//! translated into gRPC calls to the run coordinator and the session store.
//!
//! `server` (HTTP listener, upgrade, pre-auth budget), `socket` (one
//! connection's life), `handshake` + `identity` + `device` (connect),
//! `scopes` (authorization), `methods` (the method table and one file per
//! method family, `runs.resume` among them) + `params` (closed params),
//! `fanin` (the coordinators' event streams) + `fanout` (run events to
//! clients), `conn` (outbox with the slow-consumer
//! policy), `frames` (the wire shapes), `trace` (a span per request),
//! `metrics` (Prometheus).

pub mod coalesce;
pub mod config;
pub mod conn;
pub mod control_ui;
pub mod coordinators;
pub mod device;
pub mod edge;
pub mod fanin;
pub mod fanout;
pub mod frames;
#[doc(hidden)]
pub mod fuzzing;
pub mod handshake;
pub mod identity;
pub mod json_depth;
pub mod methods;
pub mod metrics;
pub mod params;
pub mod peer;
pub mod preauth_io;
pub mod presence;
pub mod request_limits;
pub mod scopes;
pub mod server;
pub mod session_feed;
pub mod settings_cache;
pub mod socket;
pub mod trace;

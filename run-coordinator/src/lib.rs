//! The run coordinator: idempotent admission, session lanes, fenced
//! execution through an agent runtime, per-run event logs, wait, cancel and
//! supersede.
//!
//! `coordinator` (state and API), `admission`, `lanes`, `control` (cancel,
//! wait, drain), `terminal` (the shared terminal path),
//! `executor` (one run's execution), `entries` (what a run writes to its
//! transcript), `companions` (the runs whose
//! messages another run carries: `steer`, `collect`), `recovery` (settling what an earlier
//! owner left), `ownership` (the partitions held and the owner tokens writes
//! carry), `fenced_store` (the store as seen through the ownership fence),
//! `leader` (lease mode: standby, renewal, self-fence, handover), `events`
//! (run event logs), `runtime` (echo, OpenAI-compatible, external gRPC),
//! `grpc` (the tonic adapter), `server` (`serve(config, listener, shutdown)`),
//! `stop` (the deadlines of a stop, planned or after a lost tenure),
//! `metrics` (Prometheus).

mod admission;
pub mod cli;
mod companions;
pub mod config;
mod control;
pub mod coordinator;
mod entries;
pub mod events;
mod executor;
mod fenced_store;
pub mod grpc;
mod lanes;
mod leader;
mod metrics;
pub mod ownership;
mod placement;
pub mod queue;
mod recovery;
pub mod run;
pub mod runtime;
pub mod server;
pub mod stop;
mod terminal;
pub mod trace;

pub use coordinator::Coordinator;
pub use run_coordinator_api::{CoordinatorError, CoordinatorResult};

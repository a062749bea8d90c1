//! The run coordinator's API without the coordinator: what its callers (the
//! gateway edge, internal services) and the coordinator itself share.
//!
//! `model` (what a run is asked to do, what is known of it, how it ended,
//! what a runtime offers), `events` (a run's events and what a subscription
//! delivers), `error` (the one error type), `grpc` (the conversions between
//! the domain and the wire, and the one mapping between errors and status
//! codes, used by both sides), and `client` (the routing client).
//!
//! Sessions hash to partitions (`clawgate_common::partition`); each
//! partition's lease in the session store names the coordinator that owns
//! it and the address it serves at. A coordinator serves only the
//! partitions it holds and answers the others UNAVAILABLE with `NOT_OWNER`.
//! [`Router`] keeps the partition → owner map from the store's
//! `WatchLeases` and sends each call to its session's owner, following
//! failovers (see [`Router`] for the rules). With every partition on one
//! coordinator it follows that one, as a single-leader client does.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use run_coordinator_api::model::{RunSpec, SubmitRequest};
//! use run_coordinator_api::{Router, RouterConfig};
//! use session_store_api::SessionKey;
//! use session_store_api::grpc::client::RemoteStore;
//!
//! let store = RemoteStore::connect("http://store:50061").await?;
//! let router = Router::new(RouterConfig::new("http://coord-a:50062,http://coord-b:50062")?, store)?;
//! let session = SessionKey::parse("main")?;
//! // The run id is the idempotency key: a retry never runs twice.
//! router
//!     .submit(SubmitRequest::new("run-1", session, RunSpec::new("agent", "hello")))
//!     .await?;
//! let waited = router.wait("run-1", 10_000).await?;
//! if let Some(run) = waited.snapshot.filter(|_| waited.terminal) {
//!     println!("{} ended {}", run.run_id, run.status.as_str());
//! }
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod error;
pub mod events;
pub mod grpc;
pub mod model;

pub use client::{CoordinatorClient, EventStream, Router, RouterConfig, Routes};
pub use error::{CoordinatorError, CoordinatorResult};

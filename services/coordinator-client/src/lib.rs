//! A routing client for the run coordinator's gRPC API
//! (`clawgate.run_coordinator.v1`), for the gateway edge and any internal
//! gRPC caller.
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
//! use clawgate_coordinator_client::{Router, RouterConfig};
//! use clawgate_proto::run_coordinator::v1 as pb;
//! use session_store_api::grpc::client::RemoteStore;
//!
//! let store = RemoteStore::connect("http://store:50061").await?;
//! let router = Router::new(RouterConfig::new("http://coord-a:50062,http://coord-b:50062")?, store)?;
//! let waited = router
//!     .wait(pb::WaitRequest { run_id: "run-1".into(), timeout_ms: 10_000 })
//!     .await?;
//! # let _ = waited;
//! # Ok(())
//! # }
//! ```

mod config;
pub mod map;
mod router;
pub mod routes;
pub mod status;

pub use config::{RouterConfig, Routes};
pub use map::{Owner, PartitionMap};
pub use router::{CoordinatorClient, Router};
pub use routes::{RunRoutes, merge_active};
pub use status::{error_detail, leader_hint, settings_changed, should_fail_over};

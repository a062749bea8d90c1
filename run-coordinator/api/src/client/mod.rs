//! The routing client: [`Router`] sends each call to the coordinator that
//! owns its session's partition by the store's leases (`map`), a run-scoped
//! call by the run's session (`routes`), and follows failovers
//! (`shared`: the one retrying call). It speaks the domain types of
//! `model` and `events`, and errors as `CoordinatorError`.

mod config;
pub mod map;
mod router;
pub mod routes;
mod shared;

pub use config::{RouterConfig, Routes};
pub use map::{Owner, PartitionMap};
pub use router::{EventStream, Router};
pub use routes::RunRoutes;
pub use shared::CoordinatorClient;

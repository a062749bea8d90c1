//! The session store: sessions, transcripts and run records behind a writer
//! fence enforced by compare-and-swap.
//!
//! Layers: `model` (domain types) + `rules` (the pure domain rules),
//! `store::SessionStore` (the trait), `backend` (memory, embedded redb,
//! PostgreSQL), `limits` (input checks as a decorator), `deadline` (the
//! operation timeout, a decorator), `metrics` (operation timing, also a
//! decorator), `grpc` (the thin tonic adapter and the remote
//! client), and `server` (`serve(config, listener, shutdown)`).
//!
//! `key`, `model`, `error`, `store` and the remote client belong to the
//! `session-store-api` crate, which clients link without the backends; they
//! are re-exported here under the same paths.

pub mod backend;
pub mod config;
pub mod deadline;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod limits;
pub mod metrics;
pub mod rules;
pub mod server;

pub use session_store_api::{SessionKey, SessionStore, StoreError, StoreResult};
pub use session_store_api::{error, key, model, store};

//! The session store: sessions, transcripts and run records behind a writer
//! fence enforced by compare-and-swap.
//!
//! Layers: `model` + `rules` (domain, pure), `store::SessionStore` (the trait),
//! `backend` (memory, embedded redb, PostgreSQL), `limits` (input checks as a
//! decorator), `metrics` (operation timing, also a decorator), `grpc` (the
//! thin tonic adapter and the remote client), and `server`
//! (`serve(config, listener, shutdown)`).

pub mod backend;
pub mod config;
pub mod error;
pub mod grpc;
pub mod key;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod rules;
pub mod server;
pub mod store;

pub use error::{StoreError, StoreResult};
pub use key::SessionKey;
pub use store::SessionStore;

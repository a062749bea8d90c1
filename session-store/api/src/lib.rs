//! The session store's API, without its backends: what a client of the store
//! (the coordinator, the edge) links.
//!
//! `key` (canonical session keys), `invalid` (the refusal of an argument),
//! `model` (the domain types), `error` (the one error type),
//! `store::SessionStore` (the trait every backend and the remote client
//! implement), `forward` (the forwarding of a store that wraps another,
//! written once: `forward_store!`), and `grpc` (the remote client, the
//! conversions between the domain and the wire, and the one mapping between
//! errors and status codes that both sides of the wire share).

pub mod error;
pub mod forward;
pub mod grpc;
pub mod invalid;
pub mod key;
pub mod model;
pub mod store;

pub use error::{StoreError, StoreResult};
pub use forward::StoreOperation;
pub use invalid::Invalid;
pub use key::SessionKey;
pub use store::SessionStore;

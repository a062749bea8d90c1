//! What one edge process shares across its connections, below the
//! behaviour that reads and changes it: the edge itself (config, backends,
//! the connection registry), a connection and its outbox, the caches, the
//! limits, and the metrics. State types import no handler, no event
//! machinery and no transport.

pub mod caches;
pub mod connection;
pub mod edge;
pub mod limits;
pub mod metrics;

pub use edge::{Backends, Edge};

//! The session store: sessions, transcripts and run records behind a writer
//! fence enforced by compare-and-swap.
//!
//! Layers: `model` + `rules` (domain, pure), `store::SessionStore` (the trait),
//! `backend` (memory, embedded redb, PostgreSQL), `limits` (input checks as a
//! decorator), `grpc` (the thin tonic adapter and the remote client), and
//! `server` (`serve(config, listener, shutdown)`).

pub mod backend;
pub mod config;
pub mod error;
pub mod grpc;
pub mod key;
pub mod limits;
pub mod model;
pub mod rules;
pub mod server;
pub mod store;

pub use error::{StoreError, StoreResult};
pub use key::SessionKey;
pub use store::SessionStore;

/// Resolves on SIGTERM (Kubernetes) or ctrl-c: the shutdown signal of every
/// clawgate binary.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

//! The store and the coordinator as two gRPC servers on loopback port 0, in
//! this process, for tests, benchmarks and examples: the coordinator reaches
//! the store over gRPC, exactly as in a deployment. Each serves `/metrics` on
//! a port 0 of its own too.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store::grpc::client::RemoteStore;
use session_store::server::{ServeOptions, serve_store};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::runtime::AgentRuntime;

pub struct LocalServices {
    /// `http://127.0.0.1:<port>` of the session store.
    pub store_url: String,
    /// `http://127.0.0.1:<port>` of the run coordinator.
    pub coordinator_url: String,
    /// Where the store serves `/metrics`.
    pub store_metrics: SocketAddr,
    /// Where the coordinator serves `/metrics`.
    pub coordinator_metrics: SocketAddr,
    pub coordinator: Coordinator,
}

/// Starts an embedded store in `dir` and a coordinator in front of it; both
/// serve until `stop` fires.
pub async fn spawn(
    dir: &Path,
    runtime: Arc<dyn AgentRuntime>,
    config: CoordinatorConfig,
    stop: CancellationToken,
) -> anyhow::Result<LocalServices> {
    let backend = EmbeddedStore::open(&dir.join("store.redb"), EmbeddedOptions::default()).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let store_url = format!("http://{}", listener.local_addr()?);
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await?;
    let store_metrics = metrics_listener.local_addr()?;
    let options = ServeOptions {
        metrics_listener: Some(metrics_listener),
        ..ServeOptions::default()
    };
    tokio::spawn(serve_store(
        Arc::new(backend),
        options,
        listener,
        stop.clone().cancelled_owned(),
    ));
    let store = RemoteStore::connect(&store_url).await?;
    let coordinator = Coordinator::start(Arc::new(store), runtime, config).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let coordinator_url = format!("http://{}", listener.local_addr()?);
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await?;
    let coordinator_metrics = metrics_listener.local_addr()?;
    let options = run_coordinator::server::ServeOptions {
        drain_timeout: Duration::from_secs(5),
        metrics_listener: Some(metrics_listener),
        ..Default::default()
    };
    tokio::spawn(run_coordinator::server::serve_coordinator(
        coordinator.clone(),
        options,
        listener,
        stop.cancelled_owned(),
    ));
    Ok(LocalServices {
        store_url,
        coordinator_url,
        store_metrics,
        coordinator_metrics,
        coordinator,
    })
}

//! `clawgate`: the whole system in one process for a laptop or a test — the
//! session store (embedded by default), the run coordinator (echo runtime by
//! default), each on its own gRPC port, and the gateway edge (OpenClaw
//! protocol v4 over WebSocket) in front. The coordinator calls the store in
//! process; the edge reaches both over gRPC, exactly as in a deployment.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use clawgate_common::parse_duration;
use run_coordinator::Coordinator;
use run_coordinator::cli::CoordinatorArgs;
use session_store::config::{LimitArgs, StoreConfig};
use session_store::limits::Checked;
use session_store::metrics::Metered;
use session_store::server::{ServeOptions, open_backend, serve_store};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "clawgate",
    version,
    about = "Session store + run coordinator in one process."
)]
struct Cli {
    /// Where the data lives: a file (embedded store) or a postgres:// URL.
    #[arg(
        long,
        env = "SESSION_STORE_URL",
        default_value = "data/session-store.redb"
    )]
    store: String,
    /// The session store's gRPC address.
    #[arg(long, env = "SESSION_STORE_LISTEN", default_value = "127.0.0.1:50061")]
    store_listen: SocketAddr,
    /// The session store's Prometheus `/metrics` address.
    #[arg(
        long,
        env = "SESSION_STORE_METRICS_LISTEN",
        default_value = "127.0.0.1:9461"
    )]
    store_metrics_listen: SocketAddr,
    /// The run coordinator's gRPC address.
    #[arg(long, env = "COORDINATOR_LISTEN", default_value = "127.0.0.1:50062")]
    coordinator_listen: SocketAddr,
    /// The run coordinator's Prometheus `/metrics` address.
    #[arg(
        long,
        env = "COORDINATOR_METRICS_LISTEN",
        default_value = "127.0.0.1:9462"
    )]
    coordinator_metrics_listen: SocketAddr,
    /// How long terminal run records are kept.
    #[arg(long, env = "SESSION_STORE_RUN_RETENTION", default_value = "24h", value_parser = parse_duration)]
    run_retention: Duration,
    /// The WebSocket address OpenClaw clients connect to.
    #[arg(long, env = "EDGE_LISTEN", default_value = "127.0.0.1:18789")]
    edge_listen: SocketAddr,
    /// The token clients authenticate with (a random one when unset).
    #[arg(long, env = "EDGE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    coordinator: CoordinatorArgs,
}

/// The addresses the listeners actually bound (a port 0 resolved).
struct Bound {
    store: SocketAddr,
    store_metrics: SocketAddr,
    coordinator: SocketAddr,
    coordinator_metrics: SocketAddr,
    edge: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telemetry = clawgate_telemetry::init("clawgate");
    let cli = Cli::parse();
    let store_config = StoreConfig {
        listen: cli.store_listen,
        metrics_listen: cli.store_metrics_listen,
        store: cli.store.clone(),
        run_retention: cli.run_retention,
        purge_interval: Duration::from_secs(60),
        pg_pool_size: 16,
        pg_schema: None,
        group_commit_max: 256,
        limits: cli.limits.clone(),
    };
    // Everything binds first, so that a port 0 becomes the real port that
    // the edge is given and that is printed.
    let store_metrics_listener = TcpListener::bind(cli.store_metrics_listen).await?;
    let store_listener = TcpListener::bind(cli.store_listen).await?;
    let coordinator_listener = TcpListener::bind(cli.coordinator_listen).await?;
    let coordinator_metrics_listener = TcpListener::bind(cli.coordinator_metrics_listen).await?;
    let edge_listener = TcpListener::bind(cli.edge_listen).await?;
    let bound = Bound {
        store: store_listener.local_addr()?,
        store_metrics: store_metrics_listener.local_addr()?,
        coordinator: coordinator_listener.local_addr()?,
        coordinator_metrics: coordinator_metrics_listener.local_addr()?,
        edge: edge_listener.local_addr()?,
    };
    let options = ServeOptions {
        metrics_listener: Some(store_metrics_listener),
        ..ServeOptions::from(&store_config)
    };
    let backend = open_backend(&store_config).await?;

    // The coordinator calls the store in process: the same checks, its
    // calls timed into the same series as the served ones, and a span per
    // call where a deployment would show the gRPC hop.
    let store = Arc::new(
        Metered::new(
            Checked::new(backend.clone(), options.limits.clone()),
            options.metrics.clone(),
        )
        .with_spans(),
    );
    let store_stop = CancellationToken::new();
    let store_server = tokio::spawn(serve_store(
        backend,
        options,
        store_listener,
        store_stop.clone().cancelled_owned(),
    ));
    let runtime = cli.coordinator.runtime.build().await?;
    let coordinator = Coordinator::start(store, runtime, cli.coordinator.config()).await?;
    let token = cli
        .token
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let mut edge_config = gateway_edge::config::EdgeConfig::with_token(
        format!("http://{}", bound.coordinator),
        format!("http://{}", bound.store),
        &token,
    );
    edge_config.listen = bound.edge;
    let edge_stop = CancellationToken::new();
    let edge_server = tokio::spawn(gateway_edge::server::serve(
        edge_config,
        edge_listener,
        edge_stop.clone().cancelled_owned(),
    ));
    println!("clawgate is up");
    println!("  gateway (OpenClaw protocol v4)  ws://{}", bound.edge);
    println!("  token                           {token}");
    println!("  session store                   grpc://{}", bound.store);
    println!(
        "  run coordinator                 grpc://{}  (runtime: {:?})",
        bound.coordinator, cli.coordinator.runtime.runtime
    );
    println!(
        "  metrics                         http://{}/metrics (edge)",
        bound.edge
    );
    println!(
        "                                  http://{}/metrics (store)",
        bound.store_metrics
    );
    println!(
        "                                  http://{}/metrics (coordinator)",
        bound.coordinator_metrics
    );
    println!("  data                            {}", cli.store);
    if telemetry.exporting() {
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .unwrap_or_default();
        println!("  traces (OTLP/gRPC)              {endpoint}");
    }

    // On a signal: the edge says `shutdown` and closes its sockets, the
    // coordinator drains, and the store it writes to stops last.
    let signal = async move {
        clawgate_common::shutdown_signal().await;
        edge_stop.cancel();
        let _ = edge_server.await;
    };
    let served = run_coordinator::server::serve_coordinator(
        coordinator,
        cli.coordinator.drain_timeout,
        coordinator_listener,
        Some(coordinator_metrics_listener),
        signal,
    )
    .await;
    store_stop.cancel();
    store_server.await??;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

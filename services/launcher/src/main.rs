//! `clawgate`: the whole system in one process for a laptop or a test — the
//! session store (embedded by default) and the run coordinator (echo runtime
//! by default), each on its own gRPC port. The coordinator calls the store in
//! process; other clients reach both over gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use clawgate_common::parse_duration;
use run_coordinator::Coordinator;
use run_coordinator::cli::CoordinatorArgs;
use session_store::config::{LimitArgs, StoreConfig};
use session_store::limits::Checked;
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
    /// The run coordinator's gRPC address.
    #[arg(long, env = "COORDINATOR_LISTEN", default_value = "127.0.0.1:50062")]
    coordinator_listen: SocketAddr,
    /// How long terminal run records are kept.
    #[arg(long, env = "SESSION_STORE_RUN_RETENTION", default_value = "24h", value_parser = parse_duration)]
    run_retention: Duration,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    coordinator: CoordinatorArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    clawgate_common::init_logging();
    let cli = Cli::parse();
    let store_config = StoreConfig {
        listen: cli.store_listen,
        store: cli.store.clone(),
        run_retention: cli.run_retention,
        purge_interval: Duration::from_secs(60),
        pg_pool_size: 16,
        pg_schema: None,
        group_commit_max: 256,
        limits: cli.limits.clone(),
    };
    let options = ServeOptions::from(&store_config);
    let backend = open_backend(&store_config).await?;
    let store_listener = TcpListener::bind(cli.store_listen).await?;
    let coordinator_listener = TcpListener::bind(cli.coordinator_listen).await?;

    let store_stop = CancellationToken::new();
    let store_server = tokio::spawn(serve_store(
        backend.clone(),
        options.clone(),
        store_listener,
        store_stop.clone().cancelled_owned(),
    ));
    let runtime = cli.coordinator.runtime.build().await?;
    let store = Arc::new(Checked::new(backend, options.limits));
    let coordinator = Coordinator::start(store, runtime, cli.coordinator.config()).await?;
    println!("clawgate is up");
    println!("  session store    grpc://{}", cli.store_listen);
    println!(
        "  run coordinator  grpc://{}  (runtime: {:?})",
        cli.coordinator_listen, cli.coordinator.runtime.runtime
    );
    println!("  data             {}", cli.store);

    // The coordinator drains first; the store it writes to stops last.
    let served = run_coordinator::server::serve_coordinator(
        coordinator,
        cli.coordinator.drain_timeout,
        coordinator_listener,
        clawgate_common::shutdown_signal(),
    )
    .await;
    store_stop.cancel();
    store_server.await??;
    served
}

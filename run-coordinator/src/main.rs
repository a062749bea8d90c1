//! The `run-coordinator` binary: flags/env → `serve` until SIGTERM or ctrl-c.

use clap::Parser;
use run_coordinator::cli::ServeArgs;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "run-coordinator",
    version,
    about = "Admits, queues and executes agent runs against the session store."
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Cli::parse().serve;
    let listener = TcpListener::bind(args.listen).await?;
    run_coordinator::server::serve(args, listener, session_store::shutdown_signal()).await
}

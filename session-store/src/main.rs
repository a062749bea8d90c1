//! The `session-store` binary: flags/env → `serve` until SIGTERM or ctrl-c.

use clap::Parser;
use session_store::config::StoreConfig;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "session-store",
    version,
    about = "Sessions, transcripts and run records behind a writer fence, over gRPC."
)]
struct Cli {
    #[command(flatten)]
    config: StoreConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = Cli::parse().config;
    let listener = TcpListener::bind(config.listen).await?;
    session_store::server::serve(config, listener, session_store::shutdown_signal()).await
}

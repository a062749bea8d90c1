//! The `session-store` binary: flags/env → `serve` until SIGTERM or ctrl-c.

clawgate_common::use_service_allocator!();

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
    let telemetry = clawgate_telemetry::init("clawgate-session-store");
    let config = Cli::parse().config;
    let listener = TcpListener::bind(config.listen).await?;
    let served =
        session_store::server::serve(config, listener, clawgate_common::shutdown_signal()).await;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

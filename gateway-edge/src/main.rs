//! The `gateway-edge` binary: flags/env → `serve` until SIGTERM or ctrl-c.

// The system allocator, not mimalloc: see `clawgate_common::allocator`
// (the edge's memory per client is a bound it promises).

use clap::Parser;
use gateway_edge::EdgeConfig;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "gateway-edge",
    version,
    about = "OpenClaw gateway protocol v4 over WebSocket, in front of the run coordinator and the session store."
)]
struct Cli {
    #[command(flatten)]
    config: EdgeConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telemetry = clawgate_telemetry::init("clawgate-gateway-edge");
    let config = Cli::parse().config;
    config.check()?;
    let listener = TcpListener::bind(config.listen).await?;
    let served = gateway_edge::serve(config, listener, clawgate_common::shutdown_signal()).await;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

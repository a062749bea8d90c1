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
    let telemetry = clawgate_telemetry::init("clawgate-run-coordinator");
    let args = Cli::parse().serve;
    let listener = TcpListener::bind(args.listen).await?;
    let served =
        run_coordinator::server::serve(args, listener, clawgate_common::shutdown_signal()).await;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

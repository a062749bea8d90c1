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
    clawgate_common::init_logging();
    let args = Cli::parse().serve;
    let listener = TcpListener::bind(args.listen).await?;
    run_coordinator::server::serve(args, listener, clawgate_common::shutdown_signal()).await
}

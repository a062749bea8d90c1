//! The `run-coordinator` binary: flags/env → `serve` until SIGTERM or ctrl-c.

clawgate_common::use_service_allocator!();

use std::time::Duration;

use clap::Parser;
use run_coordinator::cli::ServeArgs;
use tokio::net::TcpListener;

/// How long tasks left running (a DNS lookup on a blocking thread, say) may
/// hold up the exit once `serve` returned.
const EXIT_GRACE: Duration = Duration::from_secs(1);

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

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(run());
    runtime.shutdown_timeout(EXIT_GRACE);
    served
}

async fn run() -> anyhow::Result<()> {
    let telemetry = clawgate_telemetry::init("clawgate-run-coordinator");
    let args = Cli::parse().serve;
    let listener = TcpListener::bind(args.listen).await?;
    let served =
        run_coordinator::server::serve(args, listener, clawgate_common::shutdown_signal()).await;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

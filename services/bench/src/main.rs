//! `clawgate-bench`: load against an OpenClaw-protocol gateway; prints one
//! Markdown table (see the library for the scenarios).

use clap::Parser;
use clawgate_bench::{Plan, Scenario, run, table};

#[derive(Debug, Parser)]
#[command(
    name = "clawgate-bench",
    about = "Load an OpenClaw-protocol gateway and report latencies and rates."
)]
struct Args {
    /// The gateway's WebSocket URL.
    #[arg(
        long,
        env = "CLAWGATE_BENCH_URL",
        default_value = "ws://127.0.0.1:18789"
    )]
    url: String,
    /// The gateway's shared token.
    #[arg(long, env = "CLAWGATE_BENCH_TOKEN", hide_env_values = true)]
    token: String,
    /// Connection counts, comma-separated; each scenario runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    connections: Vec<usize>,
    /// Scenarios, comma-separated: connect, health, ack, run.
    #[arg(long, value_delimiter = ',', default_value = "connect,health,ack,run")]
    scenarios: Vec<String>,
    /// Operations per connection in health, ack and run.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Prefix of the session keys the load uses.
    #[arg(long, default_value = "bench")]
    session_prefix: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scenarios = args
        .scenarios
        .iter()
        .map(|name| {
            Scenario::parse(name).ok_or_else(|| {
                anyhow::anyhow!("unknown scenario {name:?} (connect, health, ack, run)")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        args.connections.iter().all(|&n| n > 0) && args.requests > 0,
        "--connections and --requests must be positive"
    );
    let plan = Plan {
        url: args.url,
        token: args.token,
        scenarios,
        connections: args.connections,
        requests: args.requests,
        session_prefix: args.session_prefix,
    };
    let rows = run(&plan).await?;
    print!("{}", table(&rows));
    Ok(())
}

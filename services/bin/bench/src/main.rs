//! `clawgate-bench`: load against an OpenClaw-protocol gateway (`--url`,
//! `--token`), or `suite`: the real topologies started here, every
//! scenario against each, the floors beside; or `scale`: complete runs per
//! second by coordinator count. Prints one Markdown table (see the library
//! for the scenarios and the floors).

// The floors run in this process: with the services' allocator, so that a
// figure and its floor differ in what the service does, not in malloc.
clawgate_common::use_service_allocator!();

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use clawgate_bench::procs::{Settings, Topology};
use clawgate_bench::report::Report;
use clawgate_bench::scenarios::{Target, startup};
use clawgate_bench::stores::{self, Backend};
use clawgate_bench::suite::{self, SuitePlan};
use clawgate_bench::{Echo, Plan, Row, Scenario, floor, parse_scenarios, scale, scenarios};

#[derive(Debug, Parser)]
#[command(
    name = "clawgate-bench",
    about = "Load an OpenClaw-protocol gateway and report latencies and rates beside their floors.",
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    direct: Direct,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the real topologies (from --bin-dir) on each backend, run every
    /// scenario against each, measure the floors, print one table.
    Suite(SuiteArgs),
    /// One store and 1, 2, 3, … run coordinators with balanced placement
    /// (from --bin-dir), the echo runtime paced so that it is the
    /// bottleneck: complete runs per second for each count, the scaling
    /// factor and the ideal.
    Scale(ScaleArgs),
}

/// Against a running gateway.
#[derive(Debug, clap::Args)]
struct Direct {
    /// The gateway's WebSocket URL.
    #[arg(
        long,
        env = "CLAWGATE_BENCH_URL",
        default_value = "ws://127.0.0.1:18789"
    )]
    url: String,
    /// The gateway's shared token.
    #[arg(long, env = "CLAWGATE_BENCH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The gateway's process id (for idle: its VmRSS).
    #[arg(long)]
    edge_pid: Option<u32>,
    /// Also measure the floors, beside the figures.
    #[arg(long)]
    floors: bool,
    /// The all-in-one binary startup starts [default: clawgate beside this
    /// binary].
    #[arg(long)]
    clawgate: Option<PathBuf>,
    #[command(flatten)]
    load: Load,
}

/// The binaries the systems are started from, and the PostgreSQL their
/// stores are made in (`suite`, `scale`).
#[derive(Debug, clap::Args)]
struct Systems {
    /// Where clawgate, session-store, run-coordinator and gateway-edge are
    /// [default: this binary's directory, e.g. target/release].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// PostgreSQL for the postgres backend: a user that may create
    /// databases (each system gets a fresh one, dropped after).
    #[arg(
        long,
        env = "CLAWGATE_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres_url: String,
}

impl Systems {
    fn bin_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.bin_dir {
            Some(dir) => Ok(dir.clone()),
            None => own_dir(),
        }
    }

    fn backend(&self, name: &str) -> anyhow::Result<Backend> {
        match name {
            "embedded" => Ok(Backend::Embedded),
            "postgres" => Ok(Backend::Postgres {
                admin_url: self.postgres_url.clone(),
            }),
            other => anyhow::bail!("unknown backend {other:?} (embedded, postgres)"),
        }
    }
}

#[derive(Debug, clap::Args)]
struct SuiteArgs {
    #[command(flatten)]
    systems: Systems,
    /// Topologies, comma-separated: all-in-one, split (plaintext gRPC),
    /// split-tls, split-mtls (gRPC over TLS, mutual TLS; test certificates).
    #[arg(long, value_delimiter = ',', default_value = "all-in-one,split")]
    topologies: Vec<String>,
    /// Store backends, comma-separated: embedded, postgres.
    #[arg(long, value_delimiter = ',', default_value = "embedded,postgres")]
    backends: Vec<String>,
    /// The edge's --preauth-per-ip.
    #[arg(long, default_value_t = 256)]
    preauth_per_ip: usize,
    #[command(flatten)]
    load: Load,
}

#[derive(Debug, clap::Args)]
struct ScaleArgs {
    #[command(flatten)]
    systems: Systems,
    /// Coordinator counts, comma-separated: one system each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    coordinators: Vec<usize>,
    /// The store's backend: embedded or postgres.
    #[arg(long, default_value = "embedded")]
    backend: String,
    /// Edges, each given every coordinator; the sessions go to them in turn.
    #[arg(long, default_value_t = 1)]
    edges: usize,
    /// Load connections, each on a session of its own sending run after run.
    #[arg(long, default_value_t = 64)]
    sessions: usize,
    /// Load before the measured window.
    #[arg(long, default_value = "5s", value_parser = clawgate_common::parse_duration)]
    warmup: Duration,
    /// The measured window.
    #[arg(long, default_value = "30s", value_parser = clawgate_common::parse_duration)]
    duration: Duration,
    /// Runs measured one at a time before the load (one run's time).
    #[arg(long, default_value_t = 5)]
    alone_runs: usize,
    /// Each coordinator's --max-executing.
    #[arg(long, default_value_t = 4)]
    max_executing: usize,
    /// The echo runtime's pieces per reply.
    #[arg(long, default_value_t = 10)]
    echo_chunks: usize,
    /// The echo runtime's pause before each piece.
    #[arg(long, default_value = "20ms", value_parser = clawgate_common::parse_duration)]
    echo_pace: Duration,
    /// The store's --partitions [default: the store's, 256].
    #[arg(long)]
    partitions: Option<u32>,
    /// The coordinators' --lease-ttl.
    #[arg(long, default_value = "2s", value_parser = clawgate_common::parse_duration)]
    lease_ttl: Duration,
    /// The coordinators' --lease-renew-interval.
    #[arg(long, default_value = "400ms", value_parser = clawgate_common::parse_duration)]
    lease_renew_interval: Duration,
    /// Prefix of the session keys the load uses.
    #[arg(long, default_value = "bench")]
    session_prefix: String,
}

/// What to run, in either mode.
#[derive(Debug, clap::Args)]
struct Load {
    /// Scenarios, comma-separated: connect, health, ack, run, fanout, idle,
    /// half-open, startup [default: connect,health,ack,run; suite: all].
    #[arg(long, value_delimiter = ',')]
    scenarios: Option<Vec<String>>,
    /// Connection counts, comma-separated; each looping scenario runs at
    /// each [default: 1,16,64; suite: 1,16,64,256].
    #[arg(long, value_delimiter = ',')]
    connections: Option<Vec<usize>>,
    /// Operations per connection in health, ack and run; runs in fanout.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Operations each connection makes first, in health, ack and run,
    /// that are not counted: every connection's first request arrives
    /// with every other's (a burst of admissions, not the steady state).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Read-only connections in fanout.
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Connections idle opens (and sockets half-open opens).
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Starts startup measures.
    #[arg(long, default_value_t = 10)]
    startup_runs: usize,
    /// The echo runtime's pieces per reply (the systems started here, and
    /// the floors).
    #[arg(long, default_value_t = 4)]
    echo_chunks: usize,
    /// The echo runtime's pause before each piece (e.g. 20ms).
    #[arg(long, default_value = "20ms", value_parser = clawgate_common::parse_duration)]
    echo_pace: Duration,
    /// The coordinator's global cap on runs executing at once, in the
    /// systems the suite starts [default: the coordinator's, 16]. Complete
    /// runs per second are at most this over one run's time.
    #[arg(long)]
    max_executing: Option<usize>,
    /// Prefix of the session keys the load uses.
    #[arg(long, default_value = "bench")]
    session_prefix: String,
    /// Open loop: each connection starts a request this long after its last
    /// one started (e.g. 500ms: 256 connections offer 512 per second), so
    /// the load is offered whatever the answers take; unset: closed loop.
    #[arg(long, value_parser = clawgate_common::parse_duration)]
    pace: Option<Duration>,
    /// How long one scenario may take (a looping one at one connection
    /// count, or idle, fanout, startup): then its row says what it measured
    /// until then and how far it got, and the next one starts.
    #[arg(long, default_value = "120s", value_parser = clawgate_common::parse_duration)]
    scenario_timeout: Duration,
    /// The share of sends, in percent, that open a new session instead of
    /// a followup turn of the connection's own (ack, run). With new
    /// sessions a connection's runs execute side by side, so `ack`'s last
    /// send waiting for its own run no longer drains the whole backlog.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    new_sessions: u8,
    /// Every send opens a new session (--new-sessions 100).
    #[arg(long, conflicts_with = "new_sessions")]
    new_session_per_send: bool,
    /// Also append each line of the table to this file as it is printed.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Load {
    fn plan(&self, suite: bool, url: String, token: String) -> anyhow::Result<Plan> {
        let scenarios = match &self.scenarios {
            Some(keys) => parse_scenarios(keys)?,
            None if suite => Scenario::ALL.to_vec(),
            None => vec![
                Scenario::Connect,
                Scenario::Health,
                Scenario::Ack,
                Scenario::Run,
            ],
        };
        let connections = match &self.connections {
            Some(counts) => counts.clone(),
            None if suite => vec![1, 16, 64, 256],
            None => vec![1, 16, 64],
        };
        anyhow::ensure!(
            connections.iter().all(|&n| n > 0) && self.requests > 0,
            "--connections and --requests must be positive"
        );
        anyhow::ensure!(
            self.watchers > 0 && self.idle > 0 && self.startup_runs > 0,
            "--watchers, --idle and --startup-runs must be positive"
        );
        anyhow::ensure!(
            !self.scenario_timeout.is_zero(),
            "--scenario-timeout must be above zero"
        );
        Ok(Plan {
            url,
            token,
            scenarios,
            connections,
            requests: self.requests,
            warmup: self.warmup,
            session_prefix: self.session_prefix.clone(),
            watchers: self.watchers,
            idle: self.idle,
            edge_pid: None,
            pace: self.pace,
            scenario_timeout: self.scenario_timeout,
            new_sessions: if self.new_session_per_send {
                100
            } else {
                self.new_sessions
            },
        })
    }

    fn echo(&self) -> Echo {
        Echo {
            chunks: self.echo_chunks.max(1),
            pace: self.echo_pace,
        }
    }

    fn settings(&self, token: String, preauth_per_ip: usize, plan: &Plan) -> Settings {
        let widest = plan.connections.iter().copied().max().unwrap_or(1);
        let needed = plan.idle.max(widest).max(plan.watchers + 1) + 64;
        Settings {
            echo: self.echo(),
            token,
            max_connections: needed.max(20_000),
            preauth_per_ip,
            max_executing: self.max_executing,
        }
    }
}

/// The directory of this binary (where cargo puts the others).
fn own_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("this binary's path")?;
    Ok(exe.parent().context("this binary's directory")?.to_owned())
}

async fn direct(args: Direct) -> anyhow::Result<(Vec<Row>, Vec<Row>)> {
    let token = args
        .token
        .context("--token (or CLAWGATE_BENCH_TOKEN) is required against a gateway")?;
    let mut plan = args.load.plan(false, args.url.clone(), token.clone())?;
    plan.edge_pid = args.edge_pid;
    let target = Target::new("gateway", "—");
    let report = Report::start(args.load.out.as_deref())?;
    if args.floors {
        floor::measure(&plan, args.load.echo(), &|row| report.floor(row)).await;
    }
    scenarios::run(&plan, &target, &|row| report.row(row)).await;
    if plan.scenarios.contains(&Scenario::Startup) {
        let clawgate = match args.clawgate {
            Some(path) => path,
            None => own_dir()?.join("clawgate"),
        };
        let settings = args.load.settings(token, 32, &plan);
        let runs = args.load.startup_runs;
        let backend = &Backend::Embedded;
        report.row(startup::measure(&plan, &clawgate, runs, backend, &settings).await);
    }
    Ok(report.finish())
}

async fn suite(args: SuiteArgs) -> anyhow::Result<(Vec<Row>, Vec<Row>)> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let load = args.load.plan(true, String::new(), token.clone())?;
    let topologies = args
        .topologies
        .iter()
        .map(|name| {
            Topology::parse(name).with_context(|| {
                format!("unknown topology {name:?} (all-in-one, split, split-tls, split-mtls)")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let backends = args
        .backends
        .iter()
        .map(|name| args.systems.backend(name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let plan = SuitePlan {
        settings: args.load.settings(token, args.preauth_per_ip, &load),
        load,
        bin_dir: args.systems.bin_dir()?,
        topologies,
        backends,
        startup_runs: args.load.startup_runs,
    };
    let report = Report::start(args.load.out.as_deref())?;
    suite::run(&plan, &report).await;
    Ok(report.finish())
}

async fn scale(args: ScaleArgs) -> anyhow::Result<Vec<scale::ScaleRow>> {
    anyhow::ensure!(
        !args.coordinators.is_empty() && args.coordinators.iter().all(|&n| n > 0),
        "--coordinators must be positive counts"
    );
    anyhow::ensure!(
        args.sessions > 0 && args.max_executing > 0 && !args.duration.is_zero(),
        "--sessions, --max-executing and --duration must be positive"
    );
    let plan = scale::ScalePlan {
        bin_dir: args.systems.bin_dir()?,
        backend: args.systems.backend(&args.backend)?,
        coordinators: args.coordinators,
        edges: args.edges.max(1),
        sessions: args.sessions,
        warmup: args.warmup,
        duration: args.duration,
        alone_runs: args.alone_runs.max(1),
        partitions: args.partitions,
        lease_ttl: args.lease_ttl,
        lease_renew: args.lease_renew_interval,
        settings: Settings {
            echo: Echo {
                chunks: args.echo_chunks.max(1),
                pace: args.echo_pace,
            },
            token: uuid::Uuid::new_v4().simple().to_string(),
            max_connections: (args.sessions + 64).max(1024),
            preauth_per_ip: 256,
            max_executing: Some(args.max_executing),
        },
        session_prefix: args.session_prefix,
    };
    let rows = scale::run(&plan).await;
    print!("{}", scale::table(&plan, &rows));
    Ok(rows)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work = async {
        match args.command {
            Some(Command::Suite(suite_args)) => suite(suite_args).await.map(Some),
            Some(Command::Scale(scale_args)) => {
                let rows = scale(scale_args).await?;
                let failed = rows.iter().filter(|r| r.outcome.is_err()).count();
                anyhow::ensure!(
                    failed == 0,
                    "{failed} coordinator counts could not be measured"
                );
                Ok(None)
            }
            None => direct(args.direct).await.map(Some),
        }
    };
    // SIGINT or SIGTERM drops the work (the processes it started are
    // killed with it), then the databases it made go.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = work => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
    };
    stores::drop_leftovers().await;
    let Some((rows, floors)) = outcome? else {
        return Ok(());
    };
    let failed: Vec<&Row> = rows.iter().chain(&floors).filter(|r| r.failed()).collect();
    for row in &failed {
        if let Some(error) = row.error() {
            eprintln!(
                "{} on {} ({}): {error}",
                row.scenario.name(),
                row.topology,
                row.backend
            );
        }
    }
    if !failed.is_empty() {
        eprintln!("{} rows could not be measured in full", failed.len());
        std::process::exit(1);
    }
    Ok(())
}

//! The real services as child processes, started through the
//! implementation the system tests share (`clawgate_common::process`: a
//! clean environment, port 0, the address read from the log, SIGTERM then
//! SIGKILL): the commands of each topology, the systems they make, and the
//! tail of each process's output kept for error messages.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clawgate_common::process::Process;
use tokio::process::Command;
use tokio::time::Instant;

pub use clawgate_common::process::procfs::{cpu_ticks, machine_ticks, open_files_limit};
pub use clawgate_common::process::{START_TIMEOUT, service_command};

use crate::grpc_tls::{GrpcTls, TlsFiles, url};
use crate::http;
use crate::plan::Echo;

/// Output lines kept per process for error messages: the services run
/// long under load, and only the end explains a failure.
const KEPT_LINES: usize = 200;

/// Starts `command` and returns once it logged `ready` with an `address`
/// field, keeping the last [`KEPT_LINES`] lines of its output.
pub async fn start_service(
    command: Command,
    name: &str,
    ready: &'static str,
) -> anyhow::Result<Process> {
    Ok(Process::start_keeping(command, name, ready, Some(KEPT_LINES)).await?)
}

/// SIGTERM, then SIGKILL (an error) if it has not exited in time.
pub async fn stop_service(mut process: Process) -> anyhow::Result<()> {
    process.stop().await?;
    Ok(())
}

/// `VmRSS` of process `pid`, KiB.
pub fn vm_rss_kib(pid: u32) -> std::io::Result<u64> {
    clawgate_common::process::procfs::status_kib(pid, "VmRSS")
}

/// How the services of a topology are set.
#[derive(Debug, Clone)]
pub struct Settings {
    pub echo: Echo,
    pub token: String,
    /// The edge's `--max-connections`.
    pub max_connections: usize,
    /// The edge's `--preauth-per-ip`.
    pub preauth_per_ip: usize,
    /// The coordinator's `--max-executing` (`None`: its default).
    pub max_executing: Option<usize>,
}

/// How the three services run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// `clawgate`: one process.
    AllInOne,
    /// `session-store`, `run-coordinator`, `gateway-edge`, their gRPC
    /// hops plaintext, over TLS or over mutual TLS.
    Split(GrpcTls),
}

impl Topology {
    pub const ALL: [Topology; 4] = [
        Self::AllInOne,
        Self::Split(GrpcTls::Off),
        Self::Split(GrpcTls::Tls),
        Self::Split(GrpcTls::Mutual),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::AllInOne => "all-in-one",
            Self::Split(GrpcTls::Off) => "split",
            Self::Split(GrpcTls::Tls) => "split-tls",
            Self::Split(GrpcTls::Mutual) => "split-mtls",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// `name` in `dir`, which must exist.
pub fn binary(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        bail!(
            "no {name} binary at {} (cargo build --release -p clawgate -p session-store \
             -p run-coordinator -p gateway-edge)",
            path.display()
        );
    }
    Ok(path)
}

/// One topology's processes, the edge's URL and process.
pub struct System {
    pub url: String,
    pub edge_pid: u32,
    /// In start order (store first).
    services: Vec<Process>,
    /// The certificates of a split topology over TLS.
    _tls: Option<TlsFiles>,
}

impl System {
    /// Starts `topology` on the store at `store` (a file path or a
    /// `postgres://` URL) and waits for the edge's `/readyz`. Whatever
    /// started is stopped again if the rest does not.
    pub async fn start(
        topology: Topology,
        bin_dir: &Path,
        store: &str,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        let mut services = Vec::new();
        let tls = match topology {
            Topology::Split(mode) => mode.files()?,
            Topology::AllInOne => None,
        };
        let started = start_services(
            topology,
            bin_dir,
            store,
            settings,
            tls.as_ref(),
            &mut services,
        )
        .await;
        let ready = match started {
            Ok(()) => {
                let edge = services.last().expect("the edge started");
                until_ready(edge.address)
                    .await
                    .with_context(|| format!("{}:\n{}", edge.name, edge.output_text()))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            let _ = stop_all(services).await;
            return Err(e);
        }
        let edge = services.last().expect("the edge started");
        Ok(Self {
            url: format!("ws://{}", edge.address),
            edge_pid: edge.pid().context("the edge's pid")?,
            services,
            _tls: tls,
        })
    }

    /// Stops the services, the edge first.
    pub async fn stop(self) -> anyhow::Result<()> {
        stop_all(self.services).await
    }
}

async fn stop_all(mut services: Vec<Process>) -> anyhow::Result<()> {
    let mut result = Ok(());
    while let Some(service) = services.pop() {
        if let Err(e) = stop_service(service).await {
            result = Err(e);
        }
    }
    result
}

const ANY_PORT: &str = "127.0.0.1:0";

fn edge_env(command: &mut Command, settings: &Settings) {
    command
        .env("EDGE_MAX_CONNECTIONS", settings.max_connections.to_string())
        .env("EDGE_PREAUTH_PER_IP", settings.preauth_per_ip.to_string())
        // The load comes from a few loopback addresses: each may hold all.
        .env("EDGE_SOCKETS_PER_IP", settings.max_connections.to_string())
        .env("EDGE_MAX_PREAUTH", settings.max_connections.to_string())
        // The load generator reads the edge's gauges where it connects.
        .env("EDGE_METRICS_ON_PUBLIC_PORT", "true")
        .env("EDGE_METRICS_LISTEN", ANY_PORT)
        // `half-open` measures sockets that never finish their head.
        .env("EDGE_HEADER_READ_TIMEOUT", "10m");
    // The edge's default cap on sockets keeps an eighth of its descriptor
    // limit for its own files (2,500 of 20,000), so `idle` could not hold
    // more than 17,500 connections on a machine whose limit is 20,000. The
    // edge inherits the bench's limit; its own files (listeners, gRPC
    // channels, epoll) need far fewer than this reserve.
    if let Ok((soft, _)) = open_files_limit(None) {
        let cap = soft.saturating_sub(EDGE_OWN_FILES).max(1);
        command.env("EDGE_MAX_SOCKETS", cap.to_string());
    }
}

/// Descriptors left to the edge's own files when the bench sets its socket
/// cap (`EDGE_MAX_SOCKETS`) from the descriptor limit.
const EDGE_OWN_FILES: u64 = 128;

fn pace(echo: &Echo) -> String {
    format!("{}ms", echo.pace.as_millis())
}

/// The all-in-one `clawgate` on port 0 everywhere, on `store`.
pub fn all_in_one(binary: &Path, store: &str, settings: &Settings) -> Command {
    let mut command = service_command(binary);
    command
        .args(["--store", store])
        .args([
            "--store-listen",
            ANY_PORT,
            "--store-metrics-listen",
            ANY_PORT,
        ])
        .args(["--coordinator-listen", ANY_PORT])
        .args(["--coordinator-metrics-listen", ANY_PORT])
        .args(["--edge-listen", ANY_PORT, "--edge-token", &settings.token])
        .args(["--coordinator-runtime", "echo"])
        .args([
            "--coordinator-echo-chunks",
            &settings.echo.chunks.to_string(),
        ])
        .args(["--coordinator-echo-pace", &pace(&settings.echo)]);
    if let Some(cap) = settings.max_executing {
        command.args(["--coordinator-max-executing", &cap.to_string()]);
    }
    edge_env(&mut command, settings);
    command
}

/// The edge's ready line (the all-in-one logs it too).
pub const EDGE_READY: &str = "gateway edge listening";

async fn start_services(
    topology: Topology,
    bin_dir: &Path,
    store: &str,
    settings: &Settings,
    tls: Option<&TlsFiles>,
    services: &mut Vec<Process>,
) -> anyhow::Result<()> {
    if topology == Topology::AllInOne {
        let command = all_in_one(&binary(bin_dir, "clawgate")?, store, settings);
        services.push(start_service(command, "clawgate", EDGE_READY).await?);
        return Ok(());
    }
    let with_tls = |mut command: Command, service: &str| {
        if let Some(files) = tls {
            files.apply(&mut command, service);
        }
        command
    };
    let command = with_tls(store_command(bin_dir, store, &[])?, "store");
    services.push(start_service(command, "session-store", STORE_READY).await?);
    let store_url = url(tls, services[0].address);
    let command = coordinator_command(bin_dir, &store_url, settings)?;
    let command = with_tls(command, "coordinator");
    services.push(start_service(command, "run-coordinator", COORDINATOR_READY).await?);
    let coordinator_url = url(tls, services[1].address);
    let command = edge_command(bin_dir, &coordinator_url, &store_url, settings)?;
    let command = with_tls(command, "edge");
    services.push(start_service(command, "gateway-edge", EDGE_READY).await?);
    Ok(())
}

/// The store's ready line.
pub const STORE_READY: &str = "session store serving gRPC";
/// The coordinator's ready line (a lease-mode one logs it before it holds
/// any partition).
pub const COORDINATOR_READY: &str = "run coordinator serving gRPC";

/// `session-store` on port 0 on `store` (a file path or a `postgres://`
/// URL), with `extra` arguments.
pub fn store_command(bin_dir: &Path, store: &str, extra: &[&str]) -> anyhow::Result<Command> {
    let mut command = service_command(&binary(bin_dir, "session-store")?);
    command
        .args(["--listen", ANY_PORT, "--metrics-listen", ANY_PORT])
        .args(["--store", store])
        .args(extra);
    Ok(command)
}

/// `run-coordinator` on port 0 against the store at `store_url`, with the
/// echo runtime (static ownership unless more flags say otherwise).
pub fn coordinator_command(
    bin_dir: &Path,
    store_url: &str,
    settings: &Settings,
) -> anyhow::Result<Command> {
    let mut command = service_command(&binary(bin_dir, "run-coordinator")?);
    command
        .args(["--listen", ANY_PORT, "--metrics-listen", ANY_PORT])
        .args(["--store-address", store_url, "--runtime", "echo"])
        .args(["--echo-chunks", &settings.echo.chunks.to_string()])
        .args(["--echo-pace", &pace(&settings.echo)]);
    if let Some(cap) = settings.max_executing {
        command.args(["--max-executing", &cap.to_string()]);
    }
    Ok(command)
}

/// `gateway-edge` on port 0, given `coordinators` (one address or several,
/// comma-separated) and the store at `store_url`.
pub fn edge_command(
    bin_dir: &Path,
    coordinators: &str,
    store_url: &str,
    settings: &Settings,
) -> anyhow::Result<Command> {
    let mut command = service_command(&binary(bin_dir, "gateway-edge")?);
    command
        .args(["--listen", ANY_PORT, "--coordinator-address", coordinators])
        .args(["--store-address", store_url])
        .args(["--auth-mode", "token", "--token", &settings.token]);
    edge_env(&mut command, settings);
    Ok(command)
}

/// Polls `address`'s `/readyz` every 2 ms until it answers 200.
pub async fn until_ready(address: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if http::get(address, "/readyz")
            .await
            .is_ok_and(|(status, _)| status == 200)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{address}/readyz did not answer 200 within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

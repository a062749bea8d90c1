//! The real services as child processes: started with a clean environment
//! on port 0, their address read from their log, their output drained and
//! its tail kept for error messages, stopped with SIGTERM (SIGKILL after a
//! deadline, and on drop). Also what `/proc` says about a process.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

pub use clawgate_common::process::service_command;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::{Echo, http};

/// How long a process may take to announce its address, and a system to
/// become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Output lines kept per process for error messages.
const KEPT_LINES: usize = 200;

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
    /// `session-store`, `run-coordinator`, `gateway-edge`.
    Split,
}

impl Topology {
    pub const ALL: [Topology; 2] = [Self::AllInOne, Self::Split];

    pub fn name(self) -> &'static str {
        match self {
            Self::AllInOne => "all-in-one",
            Self::Split => "split",
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

/// The `address` field of a log line (`… address=127.0.0.1:4000 …`);
/// fields that merely end in `address` (`store_address=`) do not count.
pub fn address_field(line: &str) -> Option<SocketAddr> {
    line.match_indices("address=").find_map(|(at, name)| {
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            return None;
        }
        let value = line[at + name.len()..].split_whitespace().next()?;
        value.trim_matches('"').parse().ok()
    })
}

/// Keeps the tail of `reader`'s lines; sends the address of the first line
/// that carries `ready`.
async fn collect(
    reader: impl AsyncRead + Unpin,
    output: Arc<Mutex<VecDeque<String>>>,
    mut announce: Option<(&'static str, oneshot::Sender<SocketAddr>)>,
) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some((ready, _)) = &announce
            && line.contains(ready)
            && let Some(address) = address_field(&line)
            && let Some((_, sender)) = announce.take()
        {
            let _ = sender.send(address);
        }
        let mut output = output.lock().unwrap();
        if output.len() == KEPT_LINES {
            output.pop_front();
        }
        output.push_back(line);
    }
}

/// A running service process (SIGKILLed if dropped while running).
pub struct Service {
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    child: Child,
    output: Arc<Mutex<VecDeque<String>>>,
}

impl Service {
    /// Starts `command` and returns once it logged `ready` with an
    /// `address` field.
    pub async fn start(
        mut command: Command,
        name: &str,
        ready: &'static str,
    ) -> anyhow::Result<Self> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let output = Arc::new(Mutex::new(VecDeque::new()));
        let (announce, announced) = oneshot::channel();
        let stdout = child.stdout.take().context("piped stdout")?;
        let stderr = child.stderr.take().context("piped stderr")?;
        tokio::spawn(collect(stdout, output.clone(), Some((ready, announce))));
        tokio::spawn(collect(stderr, output.clone(), None));
        let mut service = Self {
            name: name.to_owned(),
            address: SocketAddr::from(([0, 0, 0, 0], 0)),
            child,
            output,
        };
        match tokio::time::timeout(START_TIMEOUT, announced).await {
            Ok(Ok(address)) => service.address = address,
            Ok(Err(_)) => {
                let status = tokio::time::timeout(STOP_TIMEOUT, service.child.wait()).await;
                bail!(
                    "{name} exited before announcing its address ({status:?}):\n{}",
                    service.output()
                );
            }
            Err(_) => bail!(
                "{name} did not announce its address within {START_TIMEOUT:?}:\n{}",
                service.output()
            ),
        }
        Ok(service)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `http://address`, how the other services are given it.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The last lines it wrote.
    pub fn output(&self) -> String {
        let output = self.output.lock().unwrap();
        output.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM, then SIGKILL if it has not exited within [`STOP_TIMEOUT`].
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let Some(pid) = self.child.id() else {
            return Ok(());
        };
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        if sent.is_ok_and(|s| s.success())
            && let Ok(status) = tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await
        {
            status?;
            return Ok(());
        }
        self.child.start_kill()?;
        self.child.wait().await?;
        bail!(
            "{} did not exit within {STOP_TIMEOUT:?} of SIGTERM and was killed",
            self.name
        )
    }
}

/// One topology's processes, the edge's URL and process.
pub struct System {
    pub url: String,
    pub edge_pid: u32,
    /// In start order (store first).
    services: Vec<Service>,
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
        let started = start_services(topology, bin_dir, store, settings, &mut services).await;
        let ready = match started {
            Ok(()) => {
                let edge = services.last().expect("the edge started");
                until_ready(edge.address)
                    .await
                    .with_context(|| format!("{}:\n{}", edge.name, edge.output()))
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
        })
    }

    /// Stops the services, the edge first.
    pub async fn stop(self) -> anyhow::Result<()> {
        stop_all(self.services).await
    }
}

async fn stop_all(mut services: Vec<Service>) -> anyhow::Result<()> {
    let mut result = Ok(());
    while let Some(service) = services.pop() {
        if let Err(e) = service.stop().await {
            result = Err(e);
        }
    }
    result
}

const ANY_PORT: &str = "127.0.0.1:0";

fn edge_env(command: &mut Command, settings: &Settings) {
    command
        .env("EDGE_MAX_CONNECTIONS", settings.max_connections.to_string())
        .env("EDGE_PREAUTH_PER_IP", settings.preauth_per_ip.to_string());
}

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
    services: &mut Vec<Service>,
) -> anyhow::Result<()> {
    if topology == Topology::AllInOne {
        let command = all_in_one(&binary(bin_dir, "clawgate")?, store, settings);
        services.push(Service::start(command, "clawgate", EDGE_READY).await?);
        return Ok(());
    }
    let command = store_command(bin_dir, store, &[])?;
    services.push(Service::start(command, "session-store", STORE_READY).await?);
    let store_url = services[0].url();
    let command = coordinator_command(bin_dir, &store_url, settings)?;
    services.push(Service::start(command, "run-coordinator", COORDINATOR_READY).await?);
    let coordinator_url = services[1].url();
    let command = edge_command(bin_dir, &coordinator_url, &store_url, settings)?;
    services.push(Service::start(command, "gateway-edge", EDGE_READY).await?);
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

/// `VmRSS` of process `pid`, KiB.
pub fn vm_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

/// CPU time `pid` has used (user + system, all its threads), in the
/// kernel's clock ticks (the unit of [`machine_ticks`]).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // After the command's name, in parentheses (which may hold spaces):
    // state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("no command name in {path}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |at: usize| -> anyhow::Result<u64> {
        let field = fields.get(at).with_context(|| format!("a short {path}"))?;
        field
            .parse()
            .with_context(|| format!("cannot read {field:?} in {path}"))
    };
    Ok(tick(11)? + tick(12)?)
}

/// The whole machine's CPU time since boot, all cores, in clock ticks:
/// (busy, total), where idle and iowait are not busy (`/proc/stat`).
pub fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|line| line.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot read {line:?}"))?;
    anyhow::ensure!(ticks.len() == 8, "a short cpu line: {line:?}");
    let total: u64 = ticks.iter().sum();
    Ok((total - ticks[3] - ticks[4], total))
}

/// The soft and hard limits on open files of `pid` (this process: `None`).
pub fn open_files_limit(pid: Option<u32>) -> anyhow::Result<(u64, u64)> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/limits"),
        None => "/proc/self/limits".to_owned(),
    };
    let limits = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .with_context(|| format!("no open files limit in {path}"))?;
    let value = |raw: &str| {
        if raw == "unlimited" {
            Some(u64::MAX)
        } else {
            raw.parse().ok()
        }
    };
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    match (
        fields.first().and_then(|f| value(f)),
        fields.get(1).and_then(|f| value(f)),
    ) {
        (Some(soft), Some(hard)) => Ok((soft, hard)),
        _ => bail!("cannot read {line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_address_field_only() {
        let line = "2026-01-01T00:00:00Z  INFO gateway_edge::server: gateway edge listening address=127.0.0.1:4100";
        assert_eq!(address_field(line), Some("127.0.0.1:4100".parse().unwrap()));
        assert_eq!(address_field("store_address=127.0.0.1:1 x"), None);
        assert_eq!(address_field("address=somewhere"), None);
    }

    #[test]
    fn reads_this_process_s_limits_and_memory() {
        let (soft, hard) = open_files_limit(None).unwrap();
        assert!(soft > 0 && soft <= hard);
        assert!(vm_rss_kib(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn reads_cpu_time_of_this_process_and_the_machine() {
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_ticks(std::process::id()).unwrap() > 0);
        let (busy, total) = machine_ticks().unwrap();
        assert!(busy > 0 && busy <= total);
    }
}

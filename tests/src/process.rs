//! A service binary as a child process: started with a clean environment,
//! its output kept for failure messages, its listen address read from its
//! log, killed with a real signal. Every test that starts a process goes
//! through [`Process::start`].
//!
//! The rule this enforces: a test never binds a fixed port. While a test
//! binary runs processes it holds the all-in-one's default ports itself
//! ([`DEFAULT_PORTS`]), so a child that would listen on one of them fails at
//! once, exactly as it would next to a running `clawgate`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clawgate_telemetry::metrics::http_request;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

pub use clawgate_common::process::service_command;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a process may take to announce its address, and a service to
/// become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The ports the services listen on by default (the all-in-one's, see the
/// README): store gRPC and metrics, coordinator gRPC and metrics, the edge.
/// `services/launcher/tests/config.rs` checks this list against the binaries'
/// own defaults.
pub const DEFAULT_PORTS: [u16; 5] = [50061, 9461, 50062, 9462, 18789];

/// Takes every free default port on 127.0.0.1 for the rest of this test
/// binary's life (a port already taken, by a running `clawgate` say, is
/// taken either way).
fn hold_default_ports() {
    static HELD: OnceLock<Vec<std::net::TcpListener>> = OnceLock::new();
    HELD.get_or_init(|| {
        DEFAULT_PORTS
            .iter()
            .filter_map(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).ok())
            .collect()
    });
}

/// The exit status of a process that closed its stdout, after its stderr
/// was read to the end (so the failure message has all of it).
async fn exit_status(child: &mut Child, stderr_done: JoinHandle<()>) -> Option<ExitStatus> {
    let status = tokio::time::timeout(START_TIMEOUT, child.wait()).await;
    let _ = tokio::time::timeout(START_TIMEOUT, stderr_done).await;
    status.ok().and_then(Result::ok)
}

/// Where cargo put binary `name`: the test executable lives in
/// `target/<profile>/deps/`, the workspace's binaries in `target/<profile>/`.
/// `cargo test --workspace --all-targets` builds a package's binary only
/// for a package with integration tests of its own (as the three services
/// have); a test of another binary belongs in that binary's package, with
/// `CARGO_BIN_EXE_<name>`.
pub fn binary_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().expect("the test executable's directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "binary `{name}` not found at {}: run `cargo build --bins` first \
         (`cargo test --workspace --all-targets` builds it too)",
        path.display()
    );
    path
}

/// Reads `reader` line by line until it closes, keeping every line (with
/// `prefix`) so that the pipe never fills and failures can show the log.
/// With `announce`, sends the address of the first line that carries the
/// ready message.
async fn collect(
    reader: impl AsyncRead + Unpin,
    output: Arc<Mutex<Vec<String>>>,
    prefix: &'static str,
    mut announce: Option<(&'static str, oneshot::Sender<SocketAddr>)>,
) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = strip_ansi(&line);
        let ready = announce
            .as_ref()
            .is_some_and(|(ready, _)| line.contains(ready));
        if let Some(address) = address_field(&line).filter(|_| ready)
            && let Some((_, sender)) = announce.take()
        {
            let _ = sender.send(address);
        }
        output.lock().unwrap().push(format!("{prefix}{line}"));
    }
}

/// The `address` field of a log line, in the human format
/// (`… address=127.0.0.1:4000 …`) or as JSON (`"address":"127.0.0.1:4000"`).
/// Fields that merely end in `address` (`store_address=`) do not count.
pub fn address_field(line: &str) -> Option<SocketAddr> {
    const NAME: &str = "address";
    line.match_indices(NAME).find_map(|(at, _)| {
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            return None;
        }
        let rest = &line[at + NAME.len()..];
        let value = if let Some(human) = rest.strip_prefix('=') {
            human.split_whitespace().next()?.trim_matches('"')
        } else {
            let json = rest.strip_prefix("\":")?.trim_start().strip_prefix('"')?;
            json.split('"').next()?
        };
        value.parse().ok()
    })
}

/// The line without terminal colour sequences (`ESC [ … letter`), in case a
/// log format ignores `NO_COLOR`.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip the parameters up to and including the final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running service process; killed when dropped.
pub struct Process {
    /// The binary's name, for messages.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
    /// The tasks reading its stdout and stderr.
    collectors: Vec<JoinHandle<()>>,
}

impl Process {
    /// Starts `command` (its output piped and kept, killed on drop) and
    /// returns once it logged `ready` with an `address` field, or panics
    /// with its output. The default ports are held meanwhile (see the
    /// module's comment).
    pub async fn start(mut command: Command, name: &str, ready: &'static str) -> Process {
        hold_default_ports();
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let output = Arc::new(Mutex::new(Vec::new()));
        let (announce, announced) = oneshot::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdout_done =
            tokio::spawn(collect(stdout, output.clone(), "", Some((ready, announce))));
        let stderr_done = tokio::spawn(collect(stderr, output.clone(), "stderr| ", None));
        let args: Vec<_> = command.as_std().get_args().collect();
        let address = match tokio::time::timeout(START_TIMEOUT, announced).await {
            Ok(Ok(address)) => address,
            // Stdout closed without the line: the process is exiting.
            Ok(Err(_)) => {
                let status = exit_status(&mut child, stderr_done).await;
                drop(stdout_done);
                panic!(
                    "{name} exited before announcing its address ({status:?}), args {args:?}:\n{}",
                    output.lock().unwrap().join("\n")
                );
            }
            Err(_) => panic!(
                "{name} did not announce its address within {START_TIMEOUT:?}:\n{}",
                output.lock().unwrap().join("\n")
            ),
        };
        Process {
            name: name.to_owned(),
            address,
            child,
            output,
            collectors: vec![stdout_done, stderr_done],
        }
    }

    /// Sends SIGKILL and waits for the process to be gone.
    pub async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child
            .wait()
            .await
            .expect("the killed process is reaped");
    }

    /// Sends a real signal (`STOP`, `CONT`, `TERM`, …) with kill(1).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the process is running").to_string();
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid])
            .status()
            .expect("kill(1) runs");
        assert!(sent.success(), "kill -{signal} {} failed", self.name);
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the process to exit by itself, and for its last output;
    /// panics with its output after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                for collector in self.collectors.drain(..) {
                    let _ = tokio::time::timeout(timeout, collector).await;
                }
                status.expect("the process is reaped")
            }
            Err(_) => panic!(
                "{} did not exit within {timeout:?}:\n{}",
                self.name,
                self.output().join("\n")
            ),
        }
    }

    /// `http://address`, how the other services are given it.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// CPU time the process used so far (user + system), from
    /// `/proc/<pid>/stat`; `None` where that is not readable.
    pub fn cpu_time(&self) -> Option<std::time::Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()?)).ok()?;
        // Fields after the command name, which is in parentheses.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // Linux reports in clock ticks of 1/100 s (USER_HZ).
        Some(std::time::Duration::from_millis(ticks * 10))
    }

    /// A memory figure of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`,
    /// the peak RSS so far, …); `None` where that is not readable.
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()?)).ok()?;
        let line = status.lines().find(|line| {
            line.strip_prefix(field)
                .is_some_and(|rest| rest.starts_with(':'))
        })?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The `address` field of the first line that contains `message` (e.g.
    /// `serving /metrics`).
    pub fn logged_address(&self, message: &str) -> Option<SocketAddr> {
        let output = self.output.lock().unwrap();
        output
            .iter()
            .filter(|line| line.contains(message))
            .find_map(|line| address_field(line))
    }

    /// Every line the process wrote so far (stderr lines prefixed `stderr| `).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }
}

/// Polls `address`'s `/readyz` until it answers 200; panics after
/// `START_TIMEOUT` with `output()`.
pub async fn until_ready(address: SocketAddr, output: impl Fn() -> String) {
    let deadline = Instant::now() + START_TIMEOUT;
    while !http_ok(address, "/readyz").await {
        assert!(
            Instant::now() < deadline,
            "{address} did not become ready within {START_TIMEOUT:?}:\n{}",
            output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `GET path` answers 200 within 5 s.
pub async fn http_ok(address: SocketAddr, path: &str) -> bool {
    let exchange = http_request(address, "GET", path);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), exchange).await,
        Ok(Ok(reply)) if reply.status == 200
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_address_of_human_and_json_lines() {
        let human = "2026-01-01T00:00:00Z  INFO run_coordinator::server: run coordinator serving gRPC address=127.0.0.1:4100 epoch=3";
        assert_eq!(
            address_field(human),
            Some("127.0.0.1:4100".parse().unwrap())
        );
        let json = r#"{"timestamp":"…","level":"INFO","fields":{"message":"gateway edge listening","address":"127.0.0.1:4200"},"target":"gateway_edge::server"}"#;
        assert_eq!(address_field(json), Some("127.0.0.1:4200".parse().unwrap()));
        let spaced = r#"{"fields":{"address": "[::1]:4300"}}"#;
        assert_eq!(address_field(spaced), Some("[::1]:4300".parse().unwrap()));
    }

    #[test]
    fn ignores_other_fields_and_non_addresses() {
        assert_eq!(address_field("store_address=127.0.0.1:1 x"), None);
        assert_eq!(address_field(r#"{"store_address":"127.0.0.1:1"}"#), None);
        assert_eq!(address_field("address=somewhere"), None);
        assert_eq!(
            address_field("peer.address=127.0.0.1:1 address=127.0.0.1:2"),
            Some("127.0.0.1:2".parse().unwrap())
        );
    }

    #[test]
    fn strips_colour() {
        let coloured = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[3maddress\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:9";
        let plain = strip_ansi(coloured);
        assert_eq!(plain, "2026  INFO address=127.0.0.1:9");
        assert_eq!(address_field(&plain), Some("127.0.0.1:9".parse().unwrap()));
    }
}

//! The three real binaries as child processes: a session store on a fresh
//! data directory, a run coordinator using it with the echo runtime, and a
//! gateway edge in front of both. Every process listens on port 0 and
//! announces its address in its log; the cluster reads it from there.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_telemetry::metrics::http_request;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{EdgeClient, OPERATOR_SCOPES};

/// How long a process may take to announce its address, and the edge to
/// become ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The token clients present to the edge.
pub const TOKEN: &str = "system-test-token";

/// Variable prefixes not inherited from the test's environment: a
/// developer's shell settings (a store URL, an OTLP endpoint, a log filter)
/// must not change what the cluster does. Tests set what they need.
const SCRUBBED_PREFIXES: &[&str] = &[
    "SESSION_STORE_",
    "COORDINATOR_",
    "EDGE_",
    "OTEL_",
    "OPENAI_",
    "RUST_LOG",
    "LOG_FORMAT",
];

/// One of the three services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Store,
    Coordinator,
    Edge,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Store, Role::Coordinator, Role::Edge];

    /// The binary's file name (without the platform's suffix).
    pub fn binary(self) -> &'static str {
        match self {
            Role::Store => "session-store",
            Role::Coordinator => "run-coordinator",
            Role::Edge => "gateway-edge",
        }
    }

    /// The `service.name` the process reports (`OTEL_SERVICE_NAME`).
    pub fn service_name(self) -> &'static str {
        match self {
            Role::Store => "clawgate-session-store",
            Role::Coordinator => "clawgate-run-coordinator",
            Role::Edge => "clawgate-gateway-edge",
        }
    }

    /// The message of the log line that carries the bound address.
    fn ready_message(self) -> &'static str {
        match self {
            Role::Store => "session store serving gRPC",
            Role::Coordinator => "run coordinator serving gRPC",
            Role::Edge => "gateway edge listening",
        }
    }
}

/// Settings of a cluster before it starts.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    env: Vec<(Option<Role>, String, String)>,
    args: Vec<(Role, String)>,
    echo_chunks: usize,
    echo_pace: Duration,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            args: Vec::new(),
            echo_chunks: 4,
            echo_pace: Duration::from_millis(20),
        }
    }
}

impl ClusterBuilder {
    /// Sets an environment variable for every process. Given variables are
    /// set after the cluster's own (`NO_COLOR`, `RUST_LOG`,
    /// `OTEL_SERVICE_NAME`), so they override them.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((None, key.to_owned(), value.into()));
        self
    }

    /// Sets an environment variable for one process.
    pub fn env_for(mut self, role: Role, key: &str, value: impl Into<String>) -> Self {
        self.env.push((Some(role), key.to_owned(), value.into()));
        self
    }

    /// Adds a command-line argument for one process, after the ones the
    /// cluster passes (which are not to be repeated: clap refuses a flag
    /// given twice).
    pub fn arg(mut self, role: Role, arg: impl Into<String>) -> Self {
        self.args.push((role, arg.into()));
        self
    }

    /// The echo runtime streams a reply in at most `chunks` pieces, `pace`
    /// apart: a message of at least `chunks` characters takes about
    /// `chunks * pace`.
    pub fn echo(mut self, chunks: usize, pace: Duration) -> Self {
        self.echo_chunks = chunks;
        self.echo_pace = pace;
        self
    }

    /// Starts store, coordinator and edge, in that order (each needs the
    /// address of the ones before), and waits until the edge is ready.
    pub async fn start(self) -> Cluster {
        let data = tempfile::tempdir().expect("temporary data directory");
        let store_file = data.path().join("session-store.redb");
        let store = self
            .spawn(
                Role::Store,
                &[
                    ("--store", store_file.to_string_lossy().into_owned()),
                    ("--metrics-listen", "127.0.0.1:0".into()),
                ],
            )
            .await;
        let coordinator = self
            .spawn(
                Role::Coordinator,
                &[
                    ("--store-address", store.url()),
                    ("--metrics-listen", "127.0.0.1:0".into()),
                    ("--runtime", "echo".into()),
                    ("--echo-chunks", self.echo_chunks.to_string()),
                    ("--echo-pace", format!("{}ms", self.echo_pace.as_millis())),
                ],
            )
            .await;
        let edge = self
            .spawn(
                Role::Edge,
                &[
                    ("--coordinator-address", coordinator.url()),
                    ("--store-address", store.url()),
                    ("--auth-mode", "token".into()),
                    ("--token", TOKEN.into()),
                ],
            )
            .await;
        let cluster = Cluster {
            store,
            coordinator,
            edge,
            _data: data,
        };
        cluster.until_edge_ready().await;
        cluster
    }

    /// Starts `role` listening on a port of its choice, with `flags` and
    /// the extra arguments given for it; returns once it announced where.
    async fn spawn(&self, role: Role, flags: &[(&str, String)]) -> Process {
        let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
        for (flag, value) in flags {
            args.extend([(*flag).to_owned(), value.clone()]);
        }
        args.extend(
            self.args
                .iter()
                .filter(|(r, _)| *r == role)
                .map(|(_, a)| a.clone()),
        );
        let mut command = Command::new(binary_path(role.binary()));
        command.args(&args);
        for (key, _) in std::env::vars_os() {
            if is_scrubbed(&key) {
                command.env_remove(key);
            }
        }
        command
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env("OTEL_SERVICE_NAME", role.service_name());
        for (_, key, value) in self
            .env
            .iter()
            .filter(|(r, ..)| r.is_none_or(|r| r == role))
        {
            command.env(key, value);
        }
        Process::start(command, role.binary(), role.ready_message()).await
    }
}

fn is_scrubbed(key: &OsString) -> bool {
    key.to_str()
        .is_some_and(|k| SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p)))
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
}

impl Process {
    /// Starts `command` (its output piped and kept, killed on drop) and
    /// returns once it logged `ready` with an `address` field, or panics
    /// with its output.
    pub async fn start(mut command: Command, name: &str, ready: &'static str) -> Process {
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
        tokio::spawn(collect(stdout, output.clone(), "", Some((ready, announce))));
        let stderr_done = tokio::spawn(collect(stderr, output.clone(), "stderr| ", None));
        let args: Vec<_> = command.as_std().get_args().collect();
        let address = match tokio::time::timeout(START_TIMEOUT, announced).await {
            Ok(Ok(address)) => address,
            // Stdout closed without the line: the process is exiting.
            Ok(Err(_)) => {
                let status = exit_status(&mut child, stderr_done).await;
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

    /// Every line the process wrote so far (stderr lines prefixed `stderr| `).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }
}

/// Store, coordinator and edge as child processes, wired to each other.
/// Dropping it kills the processes and removes the data directory.
pub struct Cluster {
    pub store: Process,
    pub coordinator: Process,
    pub edge: Process,
    _data: tempfile::TempDir,
}

impl Cluster {
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// A cluster with the default settings.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    pub fn process(&self, role: Role) -> &Process {
        match role {
            Role::Store => &self.store,
            Role::Coordinator => &self.coordinator,
            Role::Edge => &self.edge,
        }
    }

    /// The edge's WebSocket URL.
    pub fn edge_url(&self) -> String {
        format!("ws://{}", self.edge.address)
    }

    /// A client connected as an operator with read, write and admin scopes.
    pub async fn connect(&self) -> EdgeClient {
        EdgeClient::connect(&self.edge_url(), TOKEN, OPERATOR_SCOPES).await
    }

    /// Every process's output, for failure messages.
    pub fn output(&self) -> String {
        let mut out = String::new();
        for role in Role::ALL {
            out.push_str(&format!("==== {} ====\n", role.binary()));
            for line in self.process(role).output() {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// Waits for the edge's `/readyz`: the edge then follows the
    /// coordinator's event stream, so no run event is missed.
    async fn until_edge_ready(&self) {
        until_ready(self.edge.address, || self.output()).await;
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

//! The three real binaries as child processes: a session store on a fresh
//! data directory, a run coordinator using it with the echo runtime, and a
//! gateway edge in front of both. Every process listens on port 0 and
//! announces its address in its log; the cluster reads it from there.

use std::time::Duration;

use crate::client::{EdgeClient, OPERATOR_SCOPES};
use crate::process::service_command;
pub use crate::process::{Process, binary_path, http_ok, until_ready};

/// The token clients present to the edge.
pub const TOKEN: &str = "system-test-token";

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
    pub fn ready_message(self) -> &'static str {
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
        let mut command = service_command(binary_path(role.binary()));
        command
            .args(&args)
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

/// One more coordinator process against the store at `store_url`, listening
/// on port 0 (metrics too), with `args` after those.
pub async fn start_coordinator(store_url: &str, args: &[&str]) -> Process {
    let mut command = service_command(binary_path(Role::Coordinator.binary()));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store-address", store_url])
        .args(args)
        .env("OTEL_SERVICE_NAME", Role::Coordinator.service_name());
    Process::start(
        command,
        Role::Coordinator.binary(),
        Role::Coordinator.ready_message(),
    )
    .await
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

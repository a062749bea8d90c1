//! The real binaries as child processes: session stores on a fresh data
//! directory or a PostgreSQL schema of their own (several replicas behind a
//! balancer, as a Kubernetes Service has them), coordinators using them
//! (static or lease ownership, the echo runtime or a gRPC runtime), and
//! gateway edges in front of both. Every process listens on port 0 and
//! announces its address in its log, where the system reads it
//! ([`crate::process`]).
//!
//! ```ignore
//! let system = System::builder().echo(4, Duration::ZERO).start().await;
//! let mut client = system.connect().await;
//! ```
//!
//! With fault links, every path to the store goes through a TCP proxy the
//! test can cut or partition, and each coordinator is reached through a
//! proxy of its own that keeps its address across restarts
//! ([`Coordinator`]). Dropping the system kills its processes;
//! [`System::finish`] also drops its PostgreSQL schema.

mod coordinator;

use std::time::Duration;

use clawgate_telemetry::metrics::{http_request, sample_value};

pub use coordinator::{Coordinator, CoordinatorSpec, RENEW, Runtime, TTL};

use crate::balancer::Balancer;
use crate::client::{Client, OPERATOR_SCOPES, TOKEN};
use crate::fault_proxy::FaultProxy;
use crate::postgres::{drop_schema, fresh_schema, postgres_url};
use crate::process::{Process, binary_path, service_command, until_ready};
use crate::sandbox::Backend;

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

/// How the processes of a system are started: what every process of a
/// role gets besides the system's own flags.
#[derive(Debug, Clone, Default)]
struct Extras {
    env: Vec<(Option<Role>, String, String)>,
    args: Vec<(Role, String)>,
}

/// A system before it starts.
#[derive(Debug, Clone)]
pub struct SystemBuilder {
    backend: Backend,
    store_args: Vec<String>,
    store_replicas: usize,
    coordinator: CoordinatorSpec,
    coordinators: usize,
    edges: usize,
    fault_links: bool,
    extras: Extras,
    /// The PostgreSQL server's URL, when not the tests' shared one.
    pg_server: Option<String>,
}

impl SystemBuilder {
    /// Where the store keeps its data: an embedded file (the default) or a
    /// PostgreSQL schema of the system's own.
    pub fn backend(mut self, backend: Backend) -> Self {
        assert_ne!(
            backend,
            Backend::Memory,
            "the store binary has no memory backend"
        );
        self.backend = backend;
        self
    }

    /// The store on PostgreSQL at `url` (a cluster of the test's own, or a
    /// fault proxy in front of one), in a schema of the system's own.
    pub fn postgres_at(mut self, url: impl Into<String>) -> Self {
        self.backend = Backend::Postgres;
        self.pg_server = Some(url.into());
        self
    }

    /// More flags for every store process (`--partitions 32`, say).
    pub fn store_args(mut self, args: &[&str]) -> Self {
        self.store_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Store processes sharing the PostgreSQL schema, behind a balancer
    /// (one by default).
    pub fn store_replicas(mut self, replicas: usize) -> Self {
        self.store_replicas = replicas;
        self
    }

    /// How every coordinator is started (see [`CoordinatorSpec`]).
    pub fn coordinator(mut self, spec: CoordinatorSpec) -> Self {
        self.coordinator = spec;
        self
    }

    /// The echo runtime streams a reply in at most `chunks` pieces, `pace`
    /// apart: a message of at least `chunks` characters takes about
    /// `chunks * pace`.
    pub fn echo(mut self, chunks: usize, pace: Duration) -> Self {
        self.coordinator.runtime = Runtime::Echo { chunks, pace };
        self
    }

    /// How many coordinators start with the system (one by default).
    pub fn coordinators(mut self, coordinators: usize) -> Self {
        self.coordinators = coordinators;
        self
    }

    /// How many edges start with the system, each given every coordinator
    /// (one by default).
    pub fn edges(mut self, edges: usize) -> Self {
        self.edges = edges;
        self
    }

    /// Every path to the store through a [`FaultProxy`], and each
    /// coordinator behind one of its own (see the module's comment).
    pub fn fault_links(mut self) -> Self {
        self.fault_links = true;
        self
    }

    /// Sets an environment variable for every process, after the system's
    /// own (`NO_COLOR`, `RUST_LOG`, `OTEL_SERVICE_NAME`), so it overrides
    /// them.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.extras.env.push((None, key.to_owned(), value.into()));
        self
    }

    /// Sets an environment variable for the processes of one role.
    pub fn env_for(mut self, role: Role, key: &str, value: impl Into<String>) -> Self {
        let entry = (Some(role), key.to_owned(), value.into());
        self.extras.env.push(entry);
        self
    }

    /// Adds a command-line argument for the processes of one role, after
    /// the ones the system passes (which are not to be repeated: clap
    /// refuses a flag given twice).
    pub fn arg(mut self, role: Role, arg: impl Into<String>) -> Self {
        self.extras.args.push((role, arg.into()));
        self
    }

    /// Starts the stores, the coordinators and the edges, in that order
    /// (each needs the addresses of the ones before), and waits until the
    /// edges are ready.
    pub async fn start(self) -> System {
        let pg_schema = (self.backend == Backend::Postgres).then(|| fresh_schema("system"));
        let mut system = System {
            stores: Vec::new(),
            coordinators: Vec::new(),
            edges: Vec::new(),
            store_balancer: None,
            edge_store_link: None,
            coordinator_spec: self.coordinator.clone(),
            store_args: self.store_args,
            fault_links: self.fault_links,
            extras: self.extras,
            pg_schema,
            pg_server: self.pg_server.unwrap_or_else(postgres_url),
            data: tempfile::tempdir().expect("a temporary data directory"),
        };
        for _ in 0..self.store_replicas.max(1) {
            let store = system.start_store().await;
            system.stores.push(store);
        }
        if system.stores.len() > 1 {
            let replicas = system.stores.iter().map(|s| s.address).collect();
            system.store_balancer = Some(Balancer::start(replicas).await);
        }
        if system.fault_links {
            let link = FaultProxy::start(system.stores[0].address).await;
            system.edge_store_link = Some(link);
        }
        for _ in 0..self.coordinators {
            system.add_coordinator(self.coordinator.clone()).await;
        }
        for _ in 0..self.edges {
            let edge = system.add_edge().await;
            until_ready(system.edges[edge].address, || system.output()).await;
        }
        system
    }
}

/// Stores, coordinators and edges as child processes, wired to each
/// other.
pub struct System {
    /// The store replicas (one, unless more were asked for).
    pub stores: Vec<Process>,
    /// In start order.
    pub coordinators: Vec<Coordinator>,
    /// In start order.
    pub edges: Vec<Process>,
    store_balancer: Option<Balancer>,
    edge_store_link: Option<FaultProxy>,
    coordinator_spec: CoordinatorSpec,
    store_args: Vec<String>,
    fault_links: bool,
    extras: Extras,
    pg_schema: Option<String>,
    /// Where the PostgreSQL schema is.
    pg_server: String,
    data: tempfile::TempDir,
}

impl System {
    /// One embedded store, one static coordinator with the echo runtime
    /// (4 pieces, 20 ms apart), one edge.
    pub fn builder() -> SystemBuilder {
        SystemBuilder {
            backend: Backend::Embedded,
            store_args: Vec::new(),
            store_replicas: 1,
            coordinator: CoordinatorSpec::default(),
            coordinators: 1,
            edges: 1,
            fault_links: false,
            extras: Extras::default(),
            pg_server: None,
        }
    }

    /// A system with the default settings.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// The first store replica.
    pub fn store(&self) -> &Process {
        &self.stores[0]
    }

    /// The first coordinator's process.
    pub fn coordinator(&self) -> &Process {
        &self.coordinators[0].process
    }

    /// The first edge.
    pub fn edge(&self) -> &Process {
        &self.edges[0]
    }

    /// Where the services reach the store: its balancer with replicas, the
    /// store itself without.
    pub fn store_url(&self) -> String {
        match &self.store_balancer {
            Some(balancer) => balancer.url(),
            None => self.stores[0].url(),
        }
    }

    /// Where the edges reach the store (through its fault link, if any).
    pub fn edge_store_url(&self) -> String {
        match &self.edge_store_link {
            Some(link) => link.url(),
            None => self.store_url(),
        }
    }

    /// The edges' fault link to the store, with fault links.
    pub fn edge_store_link(&self) -> &FaultProxy {
        self.edge_store_link
            .as_ref()
            .expect("a system with fault links")
    }

    /// The WebSocket URL of edge `n`.
    pub fn edge_url(&self, n: usize) -> String {
        format!("ws://{}", self.edges[n].address)
    }

    /// Every edge's WebSocket URL.
    pub fn edge_urls(&self) -> Vec<String> {
        (0..self.edges.len()).map(|n| self.edge_url(n)).collect()
    }

    /// Every coordinator's address as the others are given it,
    /// comma-separated (what an edge is seeded with).
    pub fn coordinator_urls(&self) -> String {
        let urls: Vec<String> = self.coordinators.iter().map(Coordinator::url).collect();
        urls.join(",")
    }

    /// A client of the first edge, connected as an operator with read,
    /// write and admin scopes.
    pub async fn connect(&self) -> Client {
        Client::connect(&self.edge_url(0), OPERATOR_SCOPES).await
    }

    /// How the system's coordinators are started, for one more that
    /// differs a little.
    pub fn coordinator_spec(&self) -> CoordinatorSpec {
        self.coordinator_spec.clone()
    }

    /// Starts `role` from its binary with `flags`, listening on a port of
    /// its choice, with the extra arguments and variables given for it;
    /// returns once it announced where.
    async fn spawn(&self, role: Role, flags: &[String]) -> Process {
        let mut command = service_command(binary_path(role.binary()));
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(flags)
            .args(
                self.extras
                    .args
                    .iter()
                    .filter(|(r, _)| *r == role)
                    .map(|(_, a)| a),
            )
            .env("OTEL_SERVICE_NAME", role.service_name());
        let env = self.extras.env.iter();
        for (_, key, value) in env.filter(|(r, ..)| r.is_none_or(|r| r == role)) {
            command.env(key, value);
        }
        Process::start(command, role.binary(), role.ready_message()).await
    }

    /// One more store process on the system's data (the same file, or the
    /// same schema).
    async fn start_store(&self) -> Process {
        let location = match &self.pg_schema {
            Some(_) => self.pg_server.clone(),
            None => self
                .data
                .path()
                .join("session-store.redb")
                .to_string_lossy()
                .into(),
        };
        let mut flags = vec!["--metrics-listen".into(), "127.0.0.1:0".into()];
        flags.extend(["--store".into(), location]);
        if let Some(schema) = &self.pg_schema {
            flags.extend(["--pg-schema".into(), schema.clone()]);
        }
        flags.extend(self.store_args.iter().cloned());
        self.spawn(Role::Store, &flags).await
    }

    /// SIGKILLs the first store, waits `down_for`, and starts it again on
    /// the same data; the fault links go to the new one.
    pub async fn restart_store(&mut self, down_for: Duration) {
        assert!(
            self.store_balancer.is_none(),
            "a replica restarts behind no balancer"
        );
        self.stores[0].kill().await;
        tokio::time::sleep(down_for).await;
        self.stores[0] = self.start_store().await;
        let address = self.stores[0].address;
        if let Some(link) = &self.edge_store_link {
            link.set_upstream(address);
        }
        for coordinator in &self.coordinators {
            if let Some(link) = &coordinator.store_link {
                link.set_upstream(address);
            }
        }
    }

    /// Starts one more edge given every coordinator; its index.
    pub async fn add_edge(&mut self) -> usize {
        let coordinators = self.coordinator_urls();
        self.add_edge_to(&coordinators).await
    }

    /// Starts one more edge given `coordinators` (comma-separated
    /// addresses); its index. Not waited for: [`until_ready`] does.
    pub async fn add_edge_to(&mut self, coordinators: &str) -> usize {
        let edge = self.start_edge(coordinators).await;
        self.edges.push(edge);
        self.edges.len() - 1
    }

    async fn start_edge(&self, coordinators: &str) -> Process {
        let flags = [
            "--coordinator-address",
            coordinators,
            "--store-address",
            &self.edge_store_url(),
            "--auth-mode",
            "token",
            "--token",
            TOKEN,
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        self.spawn(Role::Edge, &flags.map(str::to_owned)).await
    }

    /// SIGKILLs edge `n` and starts it again, given every coordinator (at
    /// another address).
    pub async fn restart_edge(&mut self, n: usize) {
        self.edges[n].kill().await;
        let coordinators = self.coordinator_urls();
        self.edges[n] = self.start_edge(&coordinators).await;
    }

    /// The first store's count of writes (and renewals) refused with
    /// STALE_OWNER.
    pub async fn stale_owner_refusals(&self) -> f64 {
        self.stale_owner_refusals_of(&["renew_leases"]).await
            + self.stale_owner_write_refusals().await
    }

    /// The store's STALE_OWNER refusals of writes (transcripts, runs,
    /// writer slots), not of lease renewals: a stale coordinator's late
    /// writes.
    pub async fn stale_owner_write_refusals(&self) -> f64 {
        self.stale_owner_refusals_of(&[
            "append",
            "update_run",
            "acquire_writer",
            "release_writer",
            "create_run",
            "start_run",
            "finish_run",
        ])
        .await
    }

    async fn stale_owner_refusals_of(&self, operations: &[&str]) -> f64 {
        let address = self
            .store()
            .logged_address("serving /metrics")
            .expect("the store's metrics");
        let text = http_request(address, "GET", "/metrics").await.unwrap().body;
        operations
            .iter()
            .filter_map(|op| {
                let labels = format!("{{operation=\"{op}\"}}");
                sample_value(&text, "clawgate_store_stale_owner_refusals_total", &labels)
            })
            .sum()
    }

    /// Every process's output under its name, for failure messages.
    pub fn output(&self) -> String {
        let stores = self.stores.iter().map(|p| ("store", p));
        let coordinators = self
            .coordinators
            .iter()
            .map(|c| ("coordinator", &c.process));
        let edges = self.edges.iter().map(|p| ("edge", p));
        let mut out = String::new();
        let mut counts = std::collections::HashMap::new();
        for (role, process) in stores.chain(coordinators).chain(edges) {
            let n = counts.entry(role).or_insert(0);
            out.push_str(&format!(
                "==== {role} {n} ====\n{}\n",
                process.output_text()
            ));
            *n += 1;
        }
        out
    }

    /// Kills every process (the edges first, the stores last) and drops
    /// the PostgreSQL schema, if any.
    pub async fn finish(mut self) {
        for edge in &mut self.edges {
            edge.kill().await;
        }
        for coordinator in &mut self.coordinators {
            coordinator.process.kill().await;
        }
        for store in &mut self.stores {
            store.kill().await;
        }
        if let Some(schema) = self.pg_schema.take() {
            drop_schema(&self.pg_server, &schema).await;
        }
    }
}

/// One attempt at a chat run through the edge: sends `chat.send` (the key
/// is `run_id`, so a retry is idempotent) and, once accepted, waits for the
/// run's end. `Some(state)`: how it ended (the chat state; a retry may find
/// it already over, and the answer then says so). `None`: not accepted yet.
pub async fn chat_run(client: &mut Client, session: &str, run_id: &str) -> Option<String> {
    let params = serde_json::json!({
        "sessionKey": session, "message": format!("turn {run_id}"), "idempotencyKey": run_id,
    });
    let res = client.request("chat.send", params).await;
    match (res["ok"].as_bool(), res["payload"]["status"].as_str()) {
        (Some(true), Some("ok")) => Some("final".to_owned()),
        (Some(true), _) => {
            let end = client.chat_end(run_id).await;
            Some(end["payload"]["state"].as_str().unwrap_or("?").to_owned())
        }
        (Some(false), Some("error")) => Some("error".to_owned()),
        _ => None,
    }
}

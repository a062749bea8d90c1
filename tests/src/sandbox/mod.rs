//! The services in this test process, each a real server on loopback port
//! 0, so every hop between them is the network hop of a deployment: a
//! session store (in memory, an embedded file, or a PostgreSQL schema of
//! its own), coordinators in front of it (static ownership, or lease
//! ownership sharing the store's partitions; see [`Member`]), and edges in
//! front of those. The store and every coordinator serve `/metrics` on a
//! port 0 of their own too.
//!
//! ```ignore
//! let sandbox = Sandbox::builder().runtime(runtime).edges(1).start().await;
//! let mut client = Client::connect(&sandbox.edge_url(), &[WRITE]).await;
//! ```
//!
//! Dropping the sandbox stops every server it started (coordinators
//! started with [`Sandbox::start_coordinator`] included); [`Sandbox::finish`]
//! also drops its PostgreSQL schema.

mod coordinators;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use gateway_edge::{Backends, Edge, EdgeConfig};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::ownership::Placement;
use run_coordinator::runtime::AgentRuntime;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use session_store::SessionStore;
use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store::backend::memory::MemoryStore;
use session_store::backend::postgres::{PgOptions, PostgresStore};
use session_store::grpc::client::RemoteStore;
use session_store::metrics::StoreMetrics;
use session_store::server::{ServeOptions, serve_store};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

pub use coordinators::{CoordinatorOptions, LEASE_TTL, Member, Ownership, RENEW_INTERVAL};

use crate::client::TOKEN;
use crate::postgres::{drop_schema, fresh_schema, postgres_url};
use crate::wait::wait_until;

/// How long a service in the sandbox may take to become ready.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// Where the store keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    /// A file in the sandbox's temporary directory.
    Embedded,
    /// A schema of the sandbox's own on the tests' PostgreSQL.
    Postgres,
}

/// A sandbox before it starts.
pub struct SandboxBuilder {
    backend: Backend,
    partitions: Option<u32>,
    runtime: Option<Arc<dyn AgentRuntime>>,
    config: CoordinatorConfig,
    ownership: Ownership,
    coordinators: usize,
    edges: usize,
}

impl SandboxBuilder {
    /// Where the store keeps its data (an embedded file by default).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The store's partition count (its default otherwise).
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The runtime every coordinator executes with (the echo runtime by
    /// default).
    pub fn runtime(mut self, runtime: Arc<dyn AgentRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The coordinators' configuration (its ownership section is replaced
    /// under lease ownership, see [`Ownership`]).
    pub fn config(mut self, config: CoordinatorConfig) -> Self {
        self.config = config;
        self
    }

    /// How the coordinators own the partitions (static by default).
    pub fn ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = ownership;
        self
    }

    /// How many coordinators start with the sandbox (one by default).
    pub fn coordinators(mut self, coordinators: usize) -> Self {
        self.coordinators = coordinators;
        self
    }

    /// How many edges start with the sandbox, in front of its coordinators
    /// (none by default: [`Sandbox::edge`] starts one with any config).
    pub fn edges(mut self, edges: usize) -> Self {
        self.edges = edges;
        self
    }

    /// Starts the store, then the coordinators (each serving before the
    /// next starts), then the edges (each ready).
    pub async fn start(self) -> Sandbox {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stop = CancellationToken::new();
        let (backend, pg_schema) = open_backend(self.backend, self.partitions, &dir).await;
        let partitions = backend
            .list_leases()
            .await
            .expect("the store lists its leases")
            .partition_count;
        let listener = bind().await;
        let store_url = url_of(&listener);
        let metrics_listener = bind().await;
        let store_metrics_address = metrics_listener.local_addr().unwrap();
        let store_metrics = StoreMetrics::default();
        let options = ServeOptions {
            metrics: store_metrics.clone(),
            metrics_listener: Some(metrics_listener),
            ..ServeOptions::default()
        };
        tokio::spawn(serve_store(
            backend,
            options,
            listener,
            stop.clone().cancelled_owned(),
        ));
        let store = RemoteStore::connect(&store_url)
            .await
            .expect("a client of the sandbox's store");
        let runtime = self
            .runtime
            .unwrap_or_else(|| Arc::new(EchoRuntime::new(EchoConfig::default())));
        let mut sandbox = Sandbox {
            stop,
            store,
            store_metrics,
            partitions,
            coordinators: Vec::new(),
            edges: Vec::new(),
            runtime,
            config: self.config,
            ownership: self.ownership,
            store_url,
            store_metrics_address,
            coordinator_channel: None,
            pg_schema,
            _dir: dir,
        };
        for _ in 0..self.coordinators {
            let options = sandbox.coordinator_options().await;
            let member = sandbox
                .start_coordinator(sandbox.runtime.clone(), options)
                .await;
            sandbox.coordinators.push(member);
        }
        sandbox.until_coordinators_serve().await;
        if let Some(first) = sandbox.coordinators.first() {
            let channel = Endpoint::from_shared(first.url.clone())
                .expect("the coordinator's URL")
                .connect_lazy();
            sandbox.coordinator_channel = Some(channel);
        }
        for _ in 0..self.edges {
            let edge = sandbox.edge(sandbox.edge_config()).await;
            sandbox.edges.push(edge);
        }
        sandbox
    }
}

/// An edge of the sandbox: its WebSocket URL and its state.
pub type SandboxEdge = (String, Arc<Edge>);

/// The services of one test, in this process.
pub struct Sandbox {
    /// Stops every server of the sandbox (cancelled on drop).
    pub stop: CancellationToken,
    /// A client of the store, for a test's own reads and writes.
    pub store: RemoteStore,
    /// Every operation the store served, timed (what its `/metrics` shows).
    pub store_metrics: StoreMetrics,
    /// The store's partition count.
    pub partitions: u32,
    /// The coordinators started with the sandbox, in start order.
    pub coordinators: Vec<Member>,
    /// The edges started with the sandbox.
    pub edges: Vec<SandboxEdge>,
    runtime: Arc<dyn AgentRuntime>,
    config: CoordinatorConfig,
    ownership: Ownership,
    store_url: String,
    store_metrics_address: SocketAddr,
    /// To the first coordinator, shared by every [`Sandbox::client`].
    coordinator_channel: Option<Channel>,
    pg_schema: Option<String>,
    _dir: tempfile::TempDir,
}

impl Sandbox {
    /// A store on an embedded file, one coordinator with the echo runtime,
    /// no edge.
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder {
            backend: Backend::Embedded,
            partitions: None,
            runtime: None,
            config: CoordinatorConfig::default(),
            ownership: Ownership::Static,
            coordinators: 1,
            edges: 0,
        }
    }

    /// A store on an embedded file and one coordinator executing with
    /// `runtime`, configured by `config`.
    pub async fn start(runtime: Arc<dyn AgentRuntime>, config: CoordinatorConfig) -> Self {
        Self::start_on(Backend::Embedded, runtime, config).await
    }

    /// [`start`](Self::start) with the store on `backend`.
    pub async fn start_on(
        backend: Backend,
        runtime: Arc<dyn AgentRuntime>,
        config: CoordinatorConfig,
    ) -> Self {
        Self::builder()
            .backend(backend)
            .runtime(runtime)
            .config(config)
            .start()
            .await
    }

    /// Waits until the coordinators started with the sandbox serve: under
    /// lease ownership, the first one (the others stand by), or all of
    /// them on their shares when balanced.
    async fn until_coordinators_serve(&self) {
        let members: Vec<&Member> = self.coordinators.iter().collect();
        match (self.ownership, members.first()) {
            (_, None) | (Ownership::Static, _) => {}
            (Ownership::Lease(Placement::Balanced), _) => self.until_spread(&members).await,
            (Ownership::Lease(_), Some(first)) => first.until_serving().await,
        }
    }

    /// `http://127.0.0.1:<port>` of the store.
    pub fn store_url(&self) -> &str {
        &self.store_url
    }

    /// Where the store serves `/metrics`.
    pub fn store_metrics_address(&self) -> SocketAddr {
        self.store_metrics_address
    }

    /// The first coordinator started with the sandbox.
    pub fn first(&self) -> &Member {
        self.coordinators
            .first()
            .expect("the sandbox started a coordinator")
    }

    /// The first coordinator, in this process.
    pub fn coordinator(&self) -> &Coordinator {
        &self.first().coordinator
    }

    /// `http://127.0.0.1:<port>` of the first coordinator.
    pub fn coordinator_url(&self) -> &str {
        &self.first().url
    }

    /// Where the first coordinator serves `/metrics`.
    pub fn coordinator_metrics_address(&self) -> SocketAddr {
        self.first().metrics_address
    }

    /// A gRPC client of the first coordinator (every one shares a
    /// connection).
    pub fn client(&self) -> RunCoordinatorClient<Channel> {
        let channel = self
            .coordinator_channel
            .clone()
            .expect("the sandbox started a coordinator");
        RunCoordinatorClient::new(channel)
    }

    /// The WebSocket URL of the first edge started with the sandbox.
    pub fn edge_url(&self) -> &str {
        &self.edges.first().expect("the sandbox started an edge").0
    }

    /// An edge config for the sandbox's coordinators (all of them, as
    /// seeds) and store, with the clients' token.
    pub fn edge_config(&self) -> EdgeConfig {
        let seeds: Vec<&str> = self.coordinators.iter().map(|m| m.url.as_str()).collect();
        self.edge_config_for(&seeds.join(","))
    }

    /// An edge config for `coordinators` (comma-separated seeds) and the
    /// store, with the clients' token; under lease ownership with a fast
    /// lease watch, so that the edge follows a move at once.
    pub fn edge_config_for(&self, coordinators: &str) -> EdgeConfig {
        let mut config =
            EdgeConfig::with_token(coordinators.to_owned(), self.store_url.clone(), TOKEN);
        if let Ownership::Lease(_) = self.ownership {
            config.coordinator_lease_watch_interval = Duration::from_millis(100);
            config.coordinator_failover_timeout = Duration::from_secs(20);
        }
        config
    }

    /// Starts an edge on port 0 serving until the sandbox stops; its
    /// WebSocket URL and state once ready (following its coordinators'
    /// event streams, so that no run event is missed).
    pub async fn edge(&self, config: EdgeConfig) -> SandboxEdge {
        let (url, edge) = self.spawn_edge(config).await;
        wait_until("the edge to become ready", READY_WITHIN, || {
            edge.fanout_ready.load(Ordering::Relaxed)
        })
        .await;
        (url, edge)
    }

    /// Starts an edge on port 0, serving until the sandbox stops; its URL
    /// and state at once, ready or not.
    pub async fn spawn_edge(&self, config: EdgeConfig) -> SandboxEdge {
        let backends = Backends::connect_lazy(&config).expect("the edge's backends");
        let edge = Edge::new(config, backends);
        let listener = bind().await;
        let url = format!("ws://{}", listener.local_addr().unwrap());
        tokio::spawn(gateway_edge::serve_edge(
            edge.clone(),
            listener,
            self.stop.clone().cancelled_owned(),
        ));
        (url, edge)
    }

    /// Stops every server and drops the PostgreSQL schema, if any.
    pub async fn finish(mut self) {
        self.stop.cancel();
        if let Some(schema) = self.pg_schema.take() {
            drop_schema(&postgres_url(), &schema).await;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A fresh store on `backend`, with `partitions` if given; the schema it
/// made on PostgreSQL.
async fn open_backend(
    backend: Backend,
    partitions: Option<u32>,
    dir: &tempfile::TempDir,
) -> (Arc<dyn SessionStore>, Option<String>) {
    match backend {
        Backend::Memory => {
            let store = match partitions {
                Some(partitions) => MemoryStore::with_partitions(partitions),
                None => MemoryStore::new(),
            };
            (Arc::new(store), None)
        }
        Backend::Embedded => {
            let defaults = EmbeddedOptions::default();
            let options = EmbeddedOptions {
                partitions: partitions.unwrap_or(defaults.partitions),
                ..defaults
            };
            let store = EmbeddedStore::open(&dir.path().join("store.redb"), options)
                .await
                .expect("an embedded store");
            (Arc::new(store), None)
        }
        Backend::Postgres => {
            let schema = fresh_schema("sandbox");
            let defaults = PgOptions::default();
            let options = PgOptions {
                schema: Some(schema.clone()),
                partitions: partitions.unwrap_or(defaults.partitions),
                ..defaults
            };
            let store = PostgresStore::connect(&postgres_url(), options)
                .await
                .unwrap_or_else(|e| panic!("the tests' PostgreSQL at {}: {e}", postgres_url()));
            (Arc::new(store), Some(schema))
        }
    }
}

/// A listener on loopback port 0.
async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port")
}

/// `http://` and the listener's address.
fn url_of(listener: &TcpListener) -> String {
    format!("http://{}", listener.local_addr().unwrap())
}

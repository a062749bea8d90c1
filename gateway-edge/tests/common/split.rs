//! Coordinators that share the partitions, in this process: one session
//! store (memory backend, a few partitions) and lease-mode coordinators,
//! each a real gRPC server on loopback port 0 advertising its address in
//! its leases, as deployed.
//!
//! A lease-mode coordinator that holds nothing takes every free partition,
//! so two of them split the partitions this way: a placeholder member holds
//! the odd ones while the first starts (it takes the even ones), then lets
//! them go for the second.

use std::sync::Arc;
use std::time::Duration;

use clawgate_common::partition::{partition_of, rendezvous_owner};
use gateway_edge::config::EdgeConfig;
use gateway_edge::edge::Edge;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::ownership::{OwnershipConfig, OwnershipMode, Placement};
use run_coordinator::runtime::AgentRuntime;
use session_store::backend::memory::MemoryStore;
use session_store::model::AcquireLeases;
use session_store::server::{ServeOptions, serve_store};
use session_store::{SessionKey, SessionStore};
use session_store_api::grpc::client::RemoteStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{DEADLINE, TOKEN};

/// Lease timing of the coordinators: a coordinator that stops renewing
/// loses its partitions to a standby after about `LEASE_TTL`.
pub const LEASE_TTL: Duration = Duration::from_secs(3);
pub const RENEW_INTERVAL: Duration = Duration::from_millis(500);

pub struct Split {
    pub store_url: String,
    /// A client of the store, for the test's own reads and lease moves.
    pub store: RemoteStore,
    pub partitions: u32,
    /// Stops the store (and every edge started here).
    pub stop: CancellationToken,
}

/// One coordinator of a `Split`.
pub struct Member {
    /// Where it serves, as it advertises (`http://…`).
    pub url: String,
    pub coordinator: Coordinator,
    /// Shuts it down gracefully: it drains, then releases its leases.
    pub stop: CancellationToken,
    pub served: JoinHandle<anyhow::Result<()>>,
}

/// How a member is started.
pub struct MemberOptions {
    /// The store address it uses (a fault proxy in front of the store, say).
    pub store_url: String,
    /// The listener it serves on.
    pub listener: TcpListener,
    /// The address it advertises (a proxy in front of it, say); its
    /// listener's by default.
    pub advertise: Option<String>,
    /// How long executing runs may take to finish at a graceful shutdown.
    pub drain_timeout: Duration,
    /// `--placement balanced` (its share of the partitions by rendezvous
    /// hashing over the live members) instead of all-on-one.
    pub balanced: bool,
}

impl Member {
    /// Its member id (also the epoch of its events and its runs' owner).
    pub fn id(&self) -> &str {
        self.coordinator.epoch()
    }

    /// The partitions it holds.
    pub fn partitions(&self) -> Vec<u32> {
        let mut held: Vec<u32> = self
            .coordinator
            .ownership()
            .tokens()
            .iter()
            .map(|t| t.partition)
            .collect();
        held.sort_unstable();
        held
    }

    /// Waits until it serves (holds partitions and has settled them).
    pub async fn until_serving(&self) {
        let deadline = Instant::now() + DEADLINE;
        while !self.coordinator.ownership().is_serving() {
            assert!(
                Instant::now() < deadline,
                "coordinator {} never served",
                self.url
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Split {
    /// A store with `partitions` partitions, serving until `stop`.
    pub async fn start(partitions: u32) -> Self {
        let backend: Arc<dyn SessionStore> = Arc::new(MemoryStore::with_partitions(partitions));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let store_url = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        tokio::spawn(serve_store(
            backend,
            ServeOptions::default(),
            listener,
            stop.clone().cancelled_owned(),
        ));
        let store = RemoteStore::connect(&store_url).await.unwrap();
        Self {
            store_url,
            store,
            partitions,
            stop,
        }
    }

    /// Options for a member on a fresh loopback listener, straight to the
    /// store.
    pub async fn options(&self) -> MemberOptions {
        MemberOptions {
            store_url: self.store_url.clone(),
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            advertise: None,
            drain_timeout: Duration::from_secs(5),
            balanced: false,
        }
    }

    /// Starts a lease-mode coordinator (it takes every free partition, or
    /// stands by).
    pub async fn member(&self, runtime: Arc<dyn AgentRuntime>, options: MemberOptions) -> Member {
        let url = options
            .advertise
            .unwrap_or_else(|| format!("http://{}", options.listener.local_addr().unwrap()));
        let config = CoordinatorConfig {
            ownership: OwnershipConfig {
                mode: OwnershipMode::Lease,
                placement: match options.balanced {
                    true => Placement::Balanced,
                    false => Placement::AllOnOne,
                },
                handoff_timeout: Duration::from_secs(2),
                advertise_address: url.clone(),
                lease_ttl: LEASE_TTL,
                renew_interval: RENEW_INTERVAL,
                ..OwnershipConfig::default()
            },
            ..CoordinatorConfig::default()
        };
        let store = RemoteStore::connect(&options.store_url).await.unwrap();
        let coordinator = Coordinator::start(Arc::new(store), runtime, config)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let served = tokio::spawn(run_coordinator::server::serve_coordinator(
            coordinator.clone(),
            run_coordinator::server::ServeOptions {
                drain_timeout: options.drain_timeout,
                ..Default::default()
            },
            options.listener,
            stop.clone().cancelled_owned(),
        ));
        Member {
            url,
            coordinator,
            stop,
            served,
        }
    }

    /// Two coordinators: the first holds the even partitions, the second
    /// the odd ones, both serving. `second` is how the second is started.
    pub async fn two(
        &self,
        runtime: Arc<dyn AgentRuntime>,
        second: MemberOptions,
    ) -> (Member, Member) {
        let odd: Vec<u32> = (0..self.partitions).filter(|p| p % 2 == 1).collect();
        let held = self
            .store
            .acquire_leases(AcquireLeases {
                member: "placeholder".into(),
                address: String::new(),
                partitions: odd.clone(),
                ttl_ms: 60_000,
                steal: false,
            })
            .await
            .unwrap();
        assert_eq!(held.granted.len(), odd.len(), "{held:?}");
        let first = self.member(runtime.clone(), self.options().await).await;
        first.until_serving().await;
        let even: Vec<u32> = (0..self.partitions).filter(|p| p % 2 == 0).collect();
        assert_eq!(first.partitions(), even);
        let tokens = held.granted.iter().filter_map(|l| l.token()).collect();
        self.store.release_leases(tokens).await.unwrap();
        let second = self.member(runtime, second).await;
        second.until_serving().await;
        assert_eq!(second.partitions(), odd);
        (first, second)
    }

    /// Waits until `members` (balanced) hold the partitions as rendezvous
    /// hashing places them over these members, all serving: where
    /// placement rests until a member joins or leaves.
    pub async fn until_spread(&self, members: &[&Member]) {
        let ids: Vec<&str> = members.iter().map(|m| m.id()).collect();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let shares: Vec<Vec<u32>> = members.iter().map(|m| m.partitions()).collect();
            let placed = (0..self.partitions).all(|p| {
                let owner = rendezvous_owner(p, &ids).expect("members");
                members
                    .iter()
                    .zip(&shares)
                    .all(|(m, share)| share.contains(&p) == (m.id() == owner))
            });
            let serving = members
                .iter()
                .all(|m| m.coordinator.ownership().is_serving());
            if placed && serving {
                return;
            }
            let lost: Vec<Option<String>> = members
                .iter()
                .map(|m| m.coordinator.ownership().lost_reason())
                .collect();
            assert!(
                Instant::now() < deadline,
                "the partitions never settled over {} members: {shares:?} (lost: {lost:?})",
                members.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A session name (as a client gives it) whose canonical key is in
    /// `partition`, the `n`-th such.
    pub fn session_in(&self, partition: u32, n: usize) -> String {
        (0..)
            .map(|i| format!("split-{partition}-{i}"))
            .filter(|name| {
                let key = SessionKey::parse(name).unwrap();
                partition_of(key.as_str(), self.partitions) == partition
            })
            .nth(n)
            .unwrap()
    }

    /// An edge config for `coordinators` (comma-separated seeds) with a
    /// fast lease watch.
    pub fn edge_config(&self, coordinators: &str) -> EdgeConfig {
        let mut config =
            EdgeConfig::with_token(coordinators.to_owned(), self.store_url.clone(), TOKEN);
        config.coordinator_lease_watch_interval = Duration::from_millis(100);
        config.coordinator_failover_timeout = Duration::from_secs(20);
        config
    }

    /// Starts an edge; returns its ws:// URL and its state once it follows
    /// `streams` coordinators' event streams, all open.
    pub async fn edge(&self, config: EdgeConfig, streams: usize) -> (String, Arc<Edge>) {
        let (url, edge) = super::spawn_edge(config, &self.stop).await;
        until_streams(&edge, streams).await;
        (url, edge)
    }
}

/// Waits until the edge follows `streams` coordinators' event streams, all
/// open.
pub async fn until_streams(edge: &Edge, streams: usize) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let routes = edge.backends.coordinator.routes();
        let wanted = routes.stream_addresses(Instant::now());
        if wanted.len() == streams && edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the edge never followed {streams} streams (it wants {wanted:?})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

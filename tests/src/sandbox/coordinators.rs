//! The sandbox's coordinators: each a real gRPC server on loopback port 0
//! (advertising its address in its leases under lease ownership, as
//! deployed), stopped on its own or with the sandbox.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clawgate_common::partition::{partition_of, rendezvous_owner};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::ownership::{OwnershipConfig, OwnershipMode, Placement};
use run_coordinator::runtime::AgentRuntime;
use session_store::grpc::client::RemoteStore;
use session_store::model::AcquireLeases;
use session_store::{SessionKey, SessionStore};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{READY_WITHIN, Sandbox, bind, url_of};
use crate::wait::{wait_for, wait_until};

/// Lease timing under lease ownership: a coordinator that stops renewing
/// loses its partitions to a standby after about `LEASE_TTL`.
pub const LEASE_TTL: Duration = Duration::from_secs(3);
pub const RENEW_INTERVAL: Duration = Duration::from_millis(500);

/// How coordinators own the store's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Each takes every partition at start: one coordinator per store.
    Static,
    /// By renewed leases ([`LEASE_TTL`], [`RENEW_INTERVAL`]): one that
    /// holds nothing takes every free partition, or stands by; with
    /// `Placement::Balanced`, each its share by rendezvous hashing over
    /// the live members.
    Lease(Placement),
}

/// How one coordinator is started.
pub struct CoordinatorOptions {
    /// Its configuration (its ownership section replaced under lease
    /// ownership).
    pub config: CoordinatorConfig,
    pub ownership: Ownership,
    /// The store address it uses (a fault proxy in front of the store, say).
    pub store_url: String,
    /// The listener it serves on.
    pub listener: TcpListener,
    /// The address it advertises (a proxy in front of it, say); its
    /// listener's by default.
    pub advertise: Option<String>,
    /// How long executing runs may take to finish at a graceful shutdown.
    pub drain_timeout: Duration,
}

/// One coordinator of a sandbox.
pub struct Member {
    /// Where it serves, as it advertises (`http://…`).
    pub url: String,
    /// Where it serves `/metrics`.
    pub metrics_address: SocketAddr,
    pub coordinator: Coordinator,
    /// Shuts it down gracefully: it drains, then releases its leases. The
    /// sandbox's stop cancels it too.
    pub stop: CancellationToken,
    pub served: JoinHandle<anyhow::Result<()>>,
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
        let what = format!("coordinator {} to serve", self.url);
        wait_until(what, READY_WITHIN, || {
            self.coordinator.ownership().is_serving()
        })
        .await;
    }
}

impl Sandbox {
    /// Options for one more coordinator like the sandbox's own, on a fresh
    /// loopback listener, straight to the store.
    pub async fn coordinator_options(&self) -> CoordinatorOptions {
        CoordinatorOptions {
            config: self.config.clone(),
            ownership: self.ownership,
            store_url: self.store_url.clone(),
            listener: bind().await,
            advertise: None,
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// Starts a coordinator executing with `runtime`; it serves until its
    /// own stop or the sandbox's. Not waited for: a lease-mode one may
    /// stand by.
    pub async fn start_coordinator(
        &self,
        runtime: Arc<dyn AgentRuntime>,
        options: CoordinatorOptions,
    ) -> Member {
        let url = options
            .advertise
            .unwrap_or_else(|| url_of(&options.listener));
        let mut config = options.config;
        if let Ownership::Lease(placement) = options.ownership {
            config.ownership = OwnershipConfig {
                mode: OwnershipMode::Lease,
                placement,
                handoff_timeout: Duration::from_secs(2),
                advertise_address: url.clone(),
                lease_ttl: LEASE_TTL,
                renew_interval: RENEW_INTERVAL,
                ..OwnershipConfig::default()
            };
        }
        let store = RemoteStore::connect(&options.store_url)
            .await
            .expect("a client of the store");
        let coordinator = Coordinator::start(Arc::new(store), runtime, config)
            .await
            .expect("the coordinator starts");
        let metrics_listener = bind().await;
        let metrics_address = metrics_listener.local_addr().unwrap();
        let stop = self.stop.child_token();
        let served = tokio::spawn(run_coordinator::server::serve_coordinator(
            coordinator.clone(),
            run_coordinator::server::ServeOptions {
                drain_timeout: options.drain_timeout,
                metrics_listener: Some(metrics_listener),
                ..Default::default()
            },
            options.listener,
            stop.clone().cancelled_owned(),
        ));
        Member {
            url,
            metrics_address,
            coordinator,
            stop,
            served,
        }
    }

    /// Two lease-mode coordinators executing with `runtime`: the first
    /// holds the even partitions, the second (started with `second`) the
    /// odd ones, both serving. A coordinator that holds nothing takes
    /// every free partition, so a placeholder member holds the odd ones
    /// while the first starts, then lets them go for the second.
    pub async fn halves(
        &self,
        runtime: Arc<dyn AgentRuntime>,
        second: CoordinatorOptions,
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
        let mut options = self.coordinator_options().await;
        options.ownership = Ownership::Lease(Placement::AllOnOne);
        let first = self.start_coordinator(runtime.clone(), options).await;
        first.until_serving().await;
        let even: Vec<u32> = (0..self.partitions).filter(|p| p % 2 == 0).collect();
        assert_eq!(first.partitions(), even);
        let tokens = held.granted.iter().filter_map(|l| l.token()).collect();
        self.store.release_leases(tokens).await.unwrap();
        let second = self.start_coordinator(runtime, second).await;
        second.until_serving().await;
        assert_eq!(second.partitions(), odd);
        (first, second)
    }

    /// Waits until `members` (balanced) hold the partitions as rendezvous
    /// hashing places them over these members, all serving: where
    /// placement rests until a member joins or leaves.
    pub async fn until_spread(&self, members: &[&Member]) {
        let ids: Vec<&str> = members.iter().map(|m| m.id()).collect();
        let what = format!("the partitions to settle over {} members", members.len());
        wait_for(what, READY_WITHIN, async || {
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
                return Ok(());
            }
            let lost: Vec<Option<String>> = members
                .iter()
                .map(|m| m.coordinator.ownership().lost_reason())
                .collect();
            Err(format!("{shares:?} (lost: {lost:?})"))
        })
        .await;
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
}

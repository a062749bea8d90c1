//! How a [`Router`](super::Router) is set up, and where its calls go.

use std::sync::Arc;
use std::time::Duration;

use clawgate_telemetry::ServiceTokens;
use clawgate_telemetry::tls::ClientTls;
use tokio::time::Instant;

use super::map::PartitionMap;

#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// The configured coordinator addresses, in order: used before the
    /// first lease table, while nobody holds a lease, and as the fallback
    /// when an owner does not answer.
    pub addresses: Vec<String>,
    /// How long a call keeps retrying through a failover (UNAVAILABLE)
    /// before it fails. Zero: one attempt.
    pub failover_timeout: Duration,
    /// HTTP/2 keepalive on every coordinator connection: a coordinator that
    /// stops answering fails its calls and streams after about twice this.
    pub keepalive: Duration,
    /// The service token the calls carry.
    pub tokens: Option<ServiceTokens>,
    /// How `https://` coordinators are reached (CAs, client certificate);
    /// none: the Mozilla roots and no client certificate.
    pub tls: Option<ClientTls>,
    /// Most runs whose session is remembered for run-scoped calls.
    pub run_routes: usize,
    /// How often the store looks for lease changes for this router.
    pub lease_watch_interval: Duration,
}

impl RouterConfig {
    pub const DEFAULT_RUN_ROUTES: usize = 100_000;

    /// `addresses`: comma-separated; the other settings at their defaults
    /// (30 s failover timeout, 2 s keepalive, no token, 100 000 run routes,
    /// a 1 s lease watch).
    pub fn new(addresses: &str) -> anyhow::Result<Self> {
        let addresses: Vec<String> = addresses
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        anyhow::ensure!(!addresses.is_empty(), "no run coordinator address given");
        Ok(Self {
            addresses,
            failover_timeout: Duration::from_secs(30),
            keepalive: Duration::from_secs(2),
            tokens: None,
            tls: None,
            run_routes: Self::DEFAULT_RUN_ROUTES,
            lease_watch_interval: Duration::from_secs(1),
        })
    }
}

/// Where calls go: the partition map and, for when the partitions are not
/// split over several coordinators, the one coordinator followed.
#[derive(Debug, Clone)]
pub struct Routes {
    pub map: Arc<PartitionMap>,
    /// The coordinator every call goes to while the partitions are not
    /// split (all on one owner, or none known): the first configured
    /// address at first, then the leader it is pointed to on UNAVAILABLE.
    pub current: String,
}

impl Routes {
    /// The coordinators whose all-runs event streams together carry every
    /// run's events: each live owner when the partitions are split (every
    /// owner if none is live), else the one followed.
    pub fn stream_addresses(&self, now: Instant) -> Vec<String> {
        if self.map.is_split() {
            let live = self.map.live_addresses(now);
            if !live.is_empty() {
                return live;
            }
            return self.map.addresses();
        }
        vec![self.current.clone()]
    }
}

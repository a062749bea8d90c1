//! The state one edge process shares across its connections: config,
//! backends, who the process is, the connection registry, the pre-auth
//! budget, the authenticator and the caches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use clawgate_telemetry::service_channel;
use run_coordinator_api::{Router, RouterConfig};
use session_store_api::grpc::client::RemoteStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use super::caches::{SettingsCache, UserPrefs};
use super::connection::Conn;
use super::limits::{AddressBudget, RequestBytes};
use super::metrics::EdgeMetrics;
use crate::auth::secret::Authenticator;
use crate::config::EdgeConfig;

/// The gRPC services behind the edge.
#[derive(Clone)]
pub struct Backends {
    /// The run coordinators, each call routed to its session's owner.
    pub coordinator: Arc<Router>,
    pub store: RemoteStore,
}

impl Backends {
    /// Lazy channels: the edge starts even if its backends are not up yet.
    /// The coordinator address is one or several, comma-separated: where
    /// the routing starts and what it falls back on (`run-coordinator-api`).
    pub fn connect_lazy(config: &EdgeConfig) -> anyhow::Result<Self> {
        let store = config.store_address.as_str();
        let endpoint = Endpoint::from_shared(store.to_owned())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let tokens = config.service_token.as_ref();
        let tls = config.tls.client().map_err(anyhow::Error::msg)?;
        let store = RemoteStore::new(service_channel(
            tls.lazy_channel(&endpoint),
            endpoint.uri(),
            tokens,
        ));
        let mut routing = RouterConfig::new(&config.coordinator_address)?;
        routing.failover_timeout = config.coordinator_failover_timeout;
        routing.keepalive = config.coordinator_keepalive;
        routing.tokens = tokens.cloned();
        routing.tls = Some(tls);
        routing.run_routes = config.coordinator_run_routes;
        routing.lease_watch_interval = config.coordinator_lease_watch_interval;
        Ok(Self {
            coordinator: Arc::new(Router::new(routing, store.clone())?),
            store,
        })
    }
}

pub struct Edge {
    pub config: EdgeConfig,
    pub backends: Backends,
    pub started: Instant,
    pub version: &'static str,
    /// A fresh id per process (`hello-ok.server.bootId`): a client that
    /// sees it change knows the gateway restarted.
    pub boot_id: String,
    /// This host's name (presence, `system.info`), read once at start.
    pub hostname: String,
    /// When this process started, ms since the epoch (its presence entry).
    pub started_at_ms: i64,
    /// Control UI preferences (`users.prefs.*`), per user, in memory.
    pub user_prefs: UserPrefs,
    next_conn: AtomicU64,
    conns: RwLock<HashMap<u64, Arc<Conn>>>,
    /// Unauthenticated sockets per client address and in all.
    pub preauth: AddressBudget,
    /// Bytes of requests being handled, all connections together.
    pub request_bytes: RequestBytes,
    /// Shared secrets, device tokens, failed attempts.
    pub auth: Authenticator,
    /// Fires on shutdown: every connection gets `shutdown` and closes 1012.
    pub shutdown: CancellationToken,
    /// Any coordinator event stream the fan-in wants is open (what
    /// `/readyz` reports; the fan-in sets it).
    pub fanout_ready: AtomicBool,
    pub metrics: Arc<EdgeMetrics>,
    /// Sessions' settings, for sends (`caches.rs`).
    pub settings_cache: SettingsCache,
}

impl Edge {
    pub fn new(config: EdgeConfig, backends: Backends) -> Arc<Self> {
        Arc::new(Self {
            backends,
            started: Instant::now(),
            version: env!("CARGO_PKG_VERSION"),
            boot_id: uuid::Uuid::new_v4().to_string(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into()),
            started_at_ms: clawgate_common::clock::now_ms(),
            user_prefs: UserPrefs::new(config.user_prefs_max_users, config.user_prefs_max_bytes),
            next_conn: AtomicU64::new(1),
            conns: RwLock::new(HashMap::new()),
            preauth: AddressBudget::new(config.preauth_per_ip, config.max_preauth),
            auth: Authenticator::new(&config),
            request_bytes: RequestBytes::new(config.max_request_bytes),
            shutdown: CancellationToken::new(),
            fanout_ready: AtomicBool::new(false),
            metrics: Arc::default(),
            settings_cache: SettingsCache::new(config.session_settings_cache),
            config,
        })
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn register(&self, conn: Arc<Conn>) {
        if self.conns.write().unwrap().insert(conn.id, conn).is_none() {
            self.metrics.connection_opened();
        }
    }

    pub fn unregister(&self, id: u64) {
        if self.conns.write().unwrap().remove(&id).is_some() {
            self.metrics.connection_closed();
        }
    }

    pub fn connections(&self) -> Vec<Arc<Conn>> {
        self.conns.read().unwrap().values().cloned().collect()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.read().unwrap().len()
    }
}

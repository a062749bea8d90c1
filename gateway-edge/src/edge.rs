//! The state one edge process shares across its connections: config,
//! backends, the connection registry, the pre-auth budget and the
//! auth-failure limiter.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use clawgate_telemetry::service_auth::constant_time_eq;
use clawgate_telemetry::service_channel;
use session_store_api::grpc::client::RemoteStore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::config::{AuthMode, EdgeConfig};
use crate::conn::Conn;
use crate::coordinators::{Router, RouterConfig};
use crate::handshake::{ConnectParams, Rejection, auth_failure};
use crate::metrics::EdgeMetrics;

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
    /// the routing starts and what it falls back on (`coordinators.rs`).
    pub fn connect_lazy(config: &EdgeConfig) -> anyhow::Result<Self> {
        let store = config.store_address.as_str();
        let endpoint = Endpoint::from_shared(store.to_owned())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let tokens = config.service_token.as_ref();
        let store = RemoteStore::new(service_channel(
            endpoint.connect_lazy(),
            endpoint.uri(),
            tokens,
        ));
        let mut routing = RouterConfig::new(&config.coordinator_address)?;
        routing.failover_timeout = config.coordinator_failover_timeout;
        routing.keepalive = config.coordinator_keepalive;
        routing.tokens = tokens.cloned();
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
    /// Bumped at each presence change (`snapshot.stateVersion.presence`).
    pub presence_version: AtomicU64,
    /// A `presence` event is scheduled.
    pub presence_pending: std::sync::atomic::AtomicBool,
    /// `session.message` events for `sessions.messages.subscribe`.
    pub session_feed: crate::session_feed::SessionFeed,
    /// Control UI preferences (`users.prefs.*`), per user, in memory.
    pub user_prefs: crate::methods::UserPrefs,
    /// The Control UI files served at `/`, when configured.
    pub control_ui: Option<crate::control_ui::ControlUi>,
    next_conn: AtomicU64,
    conns: RwLock<HashMap<u64, Arc<Conn>>>,
    preauth: Mutex<HashMap<IpAddr, usize>>,
    auth_failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    /// Fires on shutdown: every connection gets `shutdown` and closes 1012.
    pub shutdown: CancellationToken,
    pub device_tokens: crate::device::DeviceTokens,
    /// The coordinators' event streams (`fanin.rs`).
    pub fanin: crate::fanin::FanIn,
    /// Every coordinator event stream the fan-in wants is open (what
    /// `/readyz` reports).
    pub fanout_ready: std::sync::atomic::AtomicBool,
    pub metrics: Arc<EdgeMetrics>,
    /// Runs this edge accepted and has not seen end: after a coordinator
    /// failover the fan-in looks each up (`fanin.rs`), so that a run whose
    /// end happened out of its sight still reaches clients.
    pub awaited: Mutex<HashSet<String>>,
    /// Sessions' settings, for sends (`settings_cache`).
    pub settings_cache: crate::settings_cache::SettingsCache,
}

/// Most runs `Edge::awaited` remembers; past it the oldest half is not
/// looked up after a failover (clients can still `agent.wait` them).
pub const MAX_AWAITED_RUNS: usize = 100_000;

/// Holds one unauthenticated-socket slot of an IP until dropped.
pub struct PreauthSlot {
    edge: Arc<Edge>,
    ip: IpAddr,
    released: bool,
}

impl PreauthSlot {
    pub fn release(mut self) {
        self.give_back();
    }

    fn give_back(&mut self) {
        if !self.released {
            self.released = true;
            let mut preauth = self.edge.preauth.lock().unwrap();
            if let Some(count) = preauth.get_mut(&self.ip) {
                *count -= 1;
                if *count == 0 {
                    preauth.remove(&self.ip);
                }
            }
        }
    }
}

impl Drop for PreauthSlot {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl Edge {
    pub fn new(config: EdgeConfig, backends: Backends) -> Arc<Self> {
        // `EdgeConfig::check` has refused a directory that does not open.
        let control_ui = config
            .control_ui_dir
            .as_deref()
            .and_then(|dir| crate::control_ui::ControlUi::open(dir).ok());
        let device_tokens = match &config.device_token_secret {
            Some(secret) => {
                crate::device::DeviceTokens::new(Sha256::digest(secret.as_bytes()).into())
            }
            None => crate::device::DeviceTokens::random(),
        };
        let settings_cache =
            crate::settings_cache::SettingsCache::new(config.session_settings_cache);
        Arc::new(Self {
            config,
            backends,
            started: Instant::now(),
            version: env!("CARGO_PKG_VERSION"),
            boot_id: uuid::Uuid::new_v4().to_string(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into()),
            started_at_ms: session_store_api::store::now_ms(),
            presence_version: AtomicU64::new(1),
            presence_pending: Default::default(),
            control_ui,
            user_prefs: Default::default(),
            session_feed: Default::default(),
            next_conn: AtomicU64::new(1),
            conns: RwLock::new(HashMap::new()),
            preauth: Mutex::new(HashMap::new()),
            auth_failures: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            device_tokens,
            fanin: Default::default(),
            fanout_ready: std::sync::atomic::AtomicBool::new(false),
            metrics: Arc::default(),
            awaited: Mutex::new(HashSet::new()),
            settings_cache,
        })
    }

    /// Remembers a run until its end is seen. Called before its Submit: a
    /// coordinator event stream that opens while the Submit is on its way
    /// looks up the awaited runs of its partitions (`fanin.rs`), so a run
    /// that starts before that stream is open cannot end unseen.
    pub fn await_run(&self, run_id: &str) {
        let mut awaited = self.awaited.lock().unwrap();
        if awaited.len() >= MAX_AWAITED_RUNS {
            awaited.clear();
        }
        awaited.insert(run_id.to_owned());
    }

    /// Forgets an awaited run (its Submit failed, or it had ended).
    pub fn unawait_run(&self, run_id: &str) {
        self.awaited.lock().unwrap().remove(run_id);
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes an unauthenticated-socket slot for `ip`, or `None` over budget.
    pub fn take_preauth_slot(self: &Arc<Self>, ip: IpAddr) -> Option<PreauthSlot> {
        let mut preauth = self.preauth.lock().unwrap();
        let count = preauth.entry(ip).or_default();
        if *count >= self.config.preauth_per_ip {
            return None;
        }
        *count += 1;
        Some(PreauthSlot {
            edge: self.clone(),
            ip,
            released: false,
        })
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

    fn note_auth_failure(&self, ip: IpAddr) {
        let mut failures = self.auth_failures.lock().unwrap();
        let now = Instant::now();
        let entry = failures.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) > Duration::from_secs(60) {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    fn rate_limited(&self, ip: IpAddr) -> bool {
        let failures = self.auth_failures.lock().unwrap();
        failures.get(&ip).is_some_and(|(since, count)| {
            Instant::now().duration_since(*since) <= Duration::from_secs(60)
                && *count >= self.config.auth_failures_per_minute
        })
    }

    /// A device token this edge (or a replica sharing its secret) issued to
    /// the connecting device, asked for the role and scopes it was issued
    /// for. The device's signature is checked after this, as for any device.
    fn device_token_grants(&self, params: &ConnectParams) -> bool {
        let Some(device) = &params.device else {
            return false;
        };
        let Some(token) = params.auth_str("deviceToken").or(params.auth_str("token")) else {
            return false;
        };
        let Some(issued) = self.device_tokens.verify(token, &device.id) else {
            return false;
        };
        issued.role == params.role && params.scopes.iter().all(|s| issued.scopes.contains(s))
    }

    /// Shared-secret authentication (or a device token, see above). Returns
    /// the `hello-ok.auth.method`.
    pub fn authenticate(
        &self,
        params: &ConnectParams,
        ip: IpAddr,
    ) -> Result<&'static str, Rejection> {
        if self.rate_limited(ip) {
            return Err(auth_failure(
                "AUTH_RATE_LIMITED",
                "rate_limited",
                "unauthorized: too many failed authentication attempts (retry later)",
                "wait_then_retry",
            ));
        }
        let (expected, given, kind) = match self.config.auth_mode {
            AuthMode::None => return Ok("none"),
            AuthMode::Token => (
                self.config.token.as_deref(),
                params.auth_str("token"),
                "token",
            ),
            AuthMode::Password => (
                self.config.password.as_deref(),
                params.auth_str("password"),
                "password",
            ),
        };
        let expected = expected.unwrap_or_default();
        if self.device_token_grants(params) {
            return Ok("device-token");
        }
        let outcome = match given {
            None | Some("") => Err(auth_failure(
                if kind == "token" {
                    "AUTH_TOKEN_MISSING"
                } else {
                    "AUTH_PASSWORD_MISSING"
                },
                if kind == "token" {
                    "token_missing"
                } else {
                    "password_missing"
                },
                &format!("unauthorized: gateway {kind} missing (provide gateway auth {kind})"),
                "update_auth_configuration",
            )),
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(kind),
            Some(_) => Err(auth_failure(
                if kind == "token" {
                    "AUTH_TOKEN_MISMATCH"
                } else {
                    "AUTH_PASSWORD_MISMATCH"
                },
                if kind == "token" {
                    "token_mismatch"
                } else {
                    "password_mismatch"
                },
                &format!(
                    "unauthorized: gateway {kind} mismatch (use this gateway's gateway.auth.{kind} or pair the device)"
                ),
                "update_auth_credentials",
            )),
        };
        if outcome.is_err() {
            self.note_auth_failure(ip);
        }
        outcome
    }
}

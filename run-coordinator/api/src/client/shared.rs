//! What a [`Router`](super::Router)'s calls share: the clients per address,
//! the partition map from the store's leases, the run → session routes, and
//! the one retrying call every routed method makes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_telemetry::tls::client::lazy_channel;
use clawgate_telemetry::{TracedChannel, service_channel};
use futures::StreamExt;
use session_store_api::model::LeaseTable;
use session_store_api::{SessionKey, SessionStore, grpc::client::RemoteStore};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::Endpoint;

use super::config::{RouterConfig, Routes};
use super::map::PartitionMap;
use super::routes::RunRoutes;
use crate::grpc::status::{leader_hint, should_fail_over};

/// A raw gRPC client of one coordinator.
pub type CoordinatorClient = RunCoordinatorClient<TracedChannel>;

/// Lease reads closer together than this are one read (a failover makes
/// every call in flight ask at once).
const MIN_REFRESH: Duration = Duration::from_millis(100);
/// How long a read of the lease table or of a run record may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Clients kept for addresses no longer named anywhere, at most.
const MAX_CLIENTS: usize = 64;

/// Which coordinator a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The owner of this partition.
    Partition(u32),
    /// Any coordinator that serves.
    Any,
}

pub(super) struct Shared {
    pub config: RouterConfig,
    pub routes: watch::Sender<Routes>,
    pub clients: Mutex<HashMap<String, CoordinatorClient>>,
    pub runs: Mutex<RunRoutes>,
    pub store: RemoteStore,
    /// When the lease table was last read on demand.
    pub last_refresh: tokio::sync::Mutex<Option<Instant>>,
}

/// A client of the coordinator at `address` (`https://`: over TLS),
/// connected at its first call.
pub(super) fn client_for(
    address: &str,
    config: &RouterConfig,
) -> anyhow::Result<CoordinatorClient> {
    let keepalive = config.keepalive;
    let endpoint = Endpoint::from_shared(address.to_owned())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(keepalive)
        .keep_alive_timeout(keepalive)
        .keep_alive_while_idle(true);
    let channel = service_channel(
        lazy_channel(&endpoint, config.tls.as_ref()),
        endpoint.uri(),
        config.tokens.as_ref(),
    );
    Ok(RunCoordinatorClient::new(channel)
        .max_decoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES))
}

impl Shared {
    pub(super) fn client(&self, address: &str) -> anyhow::Result<CoordinatorClient> {
        let mut clients = self.clients.lock().unwrap();
        if let Some(client) = clients.get(address) {
            return Ok(client.clone());
        }
        let client = client_for(address, &self.config)?;
        if clients.len() >= MAX_CLIENTS {
            let routes = self.routes.borrow();
            let named = routes.map.addresses();
            clients.retain(|a, _| {
                self.config.addresses.contains(a) || named.contains(a) || *a == routes.current
            });
        }
        clients.insert(address.to_owned(), client.clone());
        Ok(client)
    }

    /// Takes in a lease table: receivers hear of it when a tenure changed
    /// or an owner's lease went live or lapsed.
    pub(super) fn apply(&self, table: &LeaseTable) {
        let now = Instant::now();
        let map = PartitionMap::from_table(table, now);
        self.routes.send_if_modified(|routes| {
            let changed = !routes.map.same_tenures(&map)
                || routes.map.live_addresses(now) != map.live_addresses(now);
            routes.map = Arc::new(map);
            changed
        });
    }

    pub(super) async fn refresh_leases(&self) -> Arc<PartitionMap> {
        let asked = Instant::now();
        let mut last = self.last_refresh.lock().await;
        let recent = last.is_some_and(|at| asked.saturating_duration_since(at) < MIN_REFRESH);
        if !recent {
            match tokio::time::timeout(STORE_TIMEOUT, self.store.list_leases()).await {
                Ok(Ok(table)) => self.apply(&table),
                Ok(Err(err)) => tracing::debug!(error = %err, "reading the leases failed"),
                Err(_) => tracing::debug!("reading the leases timed out"),
            }
            *last = Some(Instant::now());
        }
        self.routes.borrow().map.clone()
    }

    pub(super) fn switch_to(&self, address: &str) {
        if let Err(err) = self.client(address) {
            tracing::warn!(%address, error = %err, "unusable coordinator address");
            return;
        }
        self.routes.send_if_modified(|routes| {
            if routes.current == address {
                return false;
            }
            // Every call that meets NOT_OWNER during a failover can switch
            // (and switch back while the leases still name a dead leader):
            // a line per call would let callers flood the log.
            clawgate_telemetry::limited!(info, from = %routes.current, to = %address, "following the run coordinator leader");
            address.clone_into(&mut routes.current);
            true
        });
    }

    /// The single-leader rule (see `Router::follow`).
    pub(super) async fn follow_leader(&self, from: &str, hint: Option<String>) {
        if self.routes.borrow().current != from {
            return; // another call already moved on
        }
        if let Some(leader) = hint {
            self.switch_to(&leader);
            return;
        }
        let map = self.refresh_leases().await;
        if let Some(owner) = map.main_owner(Instant::now())
            && owner != from
        {
            self.switch_to(&owner);
            return;
        }
        let candidates = &self.config.addresses;
        let next = match candidates.iter().position(|a| a == from) {
            Some(i) => &candidates[(i + 1) % candidates.len()],
            None => &candidates[0],
        };
        self.switch_to(next);
    }

    pub(super) fn session_target(&self, session_key: &str) -> Target {
        let routes = self.routes.borrow();
        if !routes.map.is_split() {
            return Target::Any;
        }
        SessionKey::parse(session_key)
            .ok()
            .and_then(|key| routes.map.partition_of(key.as_str()))
            .map_or(Target::Any, Target::Partition)
    }

    /// The target of a call naming only a run: its session's owner when the
    /// session is remembered or its record says; else any coordinator (one
    /// that does not know the run answers so).
    pub(super) async fn run_target(&self, run_id: &str) -> Target {
        if !self.routes.borrow().map.is_split() {
            return Target::Any;
        }
        let known = self
            .runs
            .lock()
            .unwrap()
            .session_of(run_id)
            .map(str::to_owned);
        let key = match known {
            Some(key) => key,
            None => match tokio::time::timeout(STORE_TIMEOUT, self.store.get_run(run_id)).await {
                Ok(Ok(Some(record))) => {
                    self.runs.lock().unwrap().learn(run_id, &record.session_key);
                    record.session_key
                }
                _ => return Target::Any,
            },
        };
        self.routes
            .borrow()
            .map
            .partition_of(&key)
            .map_or(Target::Any, Target::Partition)
    }

    /// The address to try next for `target`, skipping those `tried` in this
    /// call (all tried: from the top again).
    pub(super) fn pick(&self, target: Target, tried: &mut Vec<String>) -> String {
        let routes = self.routes.borrow();
        if !routes.map.is_split() {
            return routes.current.clone();
        }
        let mut order: Vec<String> = match target {
            Target::Partition(p) => routes
                .map
                .owner(p)
                .map(|o| o.address.clone())
                .into_iter()
                .collect(),
            Target::Any => {
                let mut all = routes.map.live_addresses(Instant::now());
                all.extend(routes.map.addresses());
                all
            }
        };
        order.extend(self.config.addresses.iter().cloned());
        if let Some(address) = order.iter().find(|a| !tried.contains(a)) {
            return address.clone();
        }
        tried.clear();
        order.swap_remove(0)
    }

    /// Runs an idempotent call on the coordinator for `target`, retrying
    /// on UNAVAILABLE (see `Router`) until the failover timeout. Returns
    /// the answer and the address that gave it.
    pub(super) async fn call<T, F, Fut>(
        &self,
        target: Target,
        mut call: F,
    ) -> Result<(String, T), Status>
    where
        F: FnMut(CoordinatorClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.config.failover_timeout;
        let mut backoff = Duration::from_millis(50);
        let mut tried: Vec<String> = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let address = next.take().unwrap_or_else(|| self.pick(target, &mut tried));
            let status = match self.client(&address) {
                Ok(client) => match call(client).await {
                    Ok(response) => return Ok((address, response.into_inner())),
                    Err(status) => status,
                },
                Err(err) => Status::unavailable(format!(
                    "unusable run coordinator address {address}: {err}"
                )),
            };
            if !should_fail_over(&status) || Instant::now() + backoff > deadline {
                return Err(status);
            }
            tracing::debug!(%address, ?target, error = %status, "run coordinator unavailable; retrying");
            let hint = leader_hint(&status).filter(|h| *h != address);
            if self.routes.borrow().map.is_split() {
                tried.push(address);
                next = hint.filter(|h| !tried.contains(h));
                self.refresh_leases().await;
            } else {
                self.follow_leader(&address, hint).await;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// Keeps the map in step with the store's lease table: its `WatchLeases`
/// stream, and while that is not available a read every interval.
pub(super) async fn watch_leases(
    shared: Weak<Shared>,
    store: RemoteStore,
    interval: Duration,
    stop: CancellationToken,
) {
    let interval_ms = interval.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
    // Between attempts while the watch is not available.
    let pause = interval.max(MIN_REFRESH);
    // The store sends the table at least every ten of its intervals (100 ms
    // at least, as `pause`): three of those without a word and the stream
    // is taken for silent (a dead connection, a stuck store) and opened
    // again.
    let silent_after = pause * 30;
    loop {
        let opened = tokio::select! {
            opened = store.watch_leases(interval_ms) => opened,
            () = stop.cancelled() => return,
        };
        match opened {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                loop {
                    let item = tokio::select! {
                        item = tokio::time::timeout(silent_after, stream.next()) => item,
                        () = stop.cancelled() => return,
                    };
                    let Ok(item) = item else {
                        tracing::debug!(
                            ?silent_after,
                            "the lease watch went silent; opening another"
                        );
                        break;
                    };
                    let Some(Ok(table)) = item else { break };
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    shared.apply(&table);
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "watching the leases failed; reading them instead")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return,
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.refresh_leases().await;
    }
}

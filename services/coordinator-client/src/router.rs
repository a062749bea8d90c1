//! `Router`: the RunCoordinator API, each call sent to the coordinator that
//! owns the partition of its session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_telemetry::{ServiceTokens, TracedChannel, service_channel};
use futures::StreamExt;
use session_store_api::model::LeaseTable;
use session_store_api::{SessionKey, SessionStore, grpc::client::RemoteStore};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;
use tonic::transport::Endpoint;

use crate::config::{RouterConfig, Routes};
use crate::map::PartitionMap;
use crate::routes::{RunRoutes, merge_active};
use crate::status::{leader_hint, should_fail_over};

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
enum Target {
    /// The owner of this partition.
    Partition(u32),
    /// Any coordinator that serves.
    Any,
}

/// The RunCoordinator API over any number of coordinators. Each call goes
/// to the owner of its session's partition by the store's leases; calls
/// naming only a run go by the run's session (remembered from Submits and
/// events, else read from the run's record); calls about every session ask
/// every owner and merge the answers. On UNAVAILABLE (NOT_OWNER among
/// them) a call is retried with backoff, until the failover timeout: on the
/// address the error hints at, else where a fresh read of the leases
/// points, else on the configured addresses in order. Only idempotent calls
/// go through it (a retried Submit carries the same runId, its key).
///
/// While the partitions are not split (one coordinator owns them all, or
/// the leases name no address), every call goes to one coordinator, the
/// configured one first, following the leader as a single-leader client
/// does.
///
/// Needs a Tokio runtime: it watches the lease table in a task of its own,
/// which ends when the router is dropped.
pub struct Router {
    shared: Arc<Shared>,
    _watch: DropGuard,
}

struct Shared {
    config: RouterConfig,
    routes: watch::Sender<Routes>,
    clients: Mutex<HashMap<String, CoordinatorClient>>,
    runs: Mutex<RunRoutes>,
    store: RemoteStore,
    /// When the lease table was last read on demand.
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
}

fn client_for(
    address: &str,
    keepalive: Duration,
    tokens: Option<&ServiceTokens>,
) -> anyhow::Result<CoordinatorClient> {
    let endpoint = Endpoint::from_shared(address.to_owned())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(keepalive)
        .keep_alive_timeout(keepalive)
        .keep_alive_while_idle(true);
    let channel = service_channel(endpoint.connect_lazy(), endpoint.uri(), tokens);
    Ok(RunCoordinatorClient::new(channel)
        .max_decoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES))
}

/// `shared.call` of the client method `$method` with `$req` (cloned for
/// each attempt): a future of `(address, response)`.
macro_rules! routed {
    ($shared:expr, $target:expr, $req:expr, $method:ident) => {{
        let req = $req;
        $shared.call($target, move |mut c| {
            let req = req.clone();
            async move { c.$method(req).await }
        })
    }};
}

impl Router {
    /// A router over the coordinators `config` names, reading leases from
    /// `store`. Connections open lazily, one per address.
    pub fn new(config: RouterConfig, store: RemoteStore) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !config.keepalive.is_zero(),
            "the coordinator keepalive must be above zero"
        );
        anyhow::ensure!(
            !config.addresses.is_empty(),
            "no run coordinator address given"
        );
        let mut clients = HashMap::new();
        for address in &config.addresses {
            clients.insert(
                address.clone(),
                client_for(address, config.keepalive, config.tokens.as_ref())?,
            );
        }
        let routes = watch::Sender::new(Routes {
            map: Arc::default(),
            current: config.addresses[0].clone(),
        });
        let shared = Arc::new(Shared {
            runs: Mutex::new(RunRoutes::new(config.run_routes)),
            config,
            routes,
            clients: Mutex::new(clients),
            store: store.clone(),
            last_refresh: tokio::sync::Mutex::new(None),
        });
        let stop = CancellationToken::new();
        tokio::spawn(watch_leases(
            Arc::downgrade(&shared),
            store,
            shared.config.lease_watch_interval,
            stop.clone(),
        ));
        Ok(Self {
            shared,
            _watch: stop.drop_guard(),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.shared.config
    }

    /// Where calls go now.
    pub fn routes(&self) -> Routes {
        self.shared.routes.borrow().clone()
    }

    /// Follows `routes`: changes when an owner or the followed coordinator
    /// does (lease renewals are not changes).
    pub fn watch_routes(&self) -> watch::Receiver<Routes> {
        self.shared.routes.subscribe()
    }

    /// The coordinator followed while the partitions are not split.
    pub fn current_address(&self) -> String {
        self.shared.routes.borrow().current.clone()
    }

    /// The client of `address` (made on first use, connected lazily).
    pub fn client_at(&self, address: &str) -> anyhow::Result<CoordinatorClient> {
        self.shared.client(address)
    }

    /// Remembers which session a run belongs to (its session key as given
    /// to Submit, or canonical from an event).
    pub fn learn(&self, run_id: &str, session_key: &str) {
        let canonical = match SessionKey::parse(session_key) {
            Ok(key) => key,
            Err(_) => return,
        };
        self.learn_canonical(run_id, canonical.as_str());
    }

    /// `learn` of a key known to be canonical (a run event's).
    pub fn learn_canonical(&self, run_id: &str, canonical_key: &str) {
        let mut runs = self.shared.runs.lock().unwrap();
        if runs.session_of(run_id).is_none() {
            runs.learn(run_id, canonical_key);
        }
    }

    /// The partition of a canonical session key, once the partition count
    /// is known.
    pub fn partition_of_session(&self, canonical_key: &str) -> Option<u32> {
        self.shared.routes.borrow().map.partition_of(canonical_key)
    }

    /// The partition of a run whose session this router remembers (no
    /// store read).
    pub fn partition_of_run(&self, run_id: &str) -> Option<u32> {
        let key = self
            .shared
            .runs
            .lock()
            .unwrap()
            .session_of(run_id)?
            .to_owned();
        self.partition_of_session(&key)
    }

    /// Reads the lease table now (unless it was read an instant ago) and
    /// returns the map.
    pub async fn refresh_leases(&self) -> Arc<PartitionMap> {
        self.shared.refresh_leases().await
    }

    /// After the coordinator at `from` failed: while the partitions are not
    /// split, moves to the hinted leader, else to the owner of most live
    /// leases, else to the next configured address. Split, reads the lease
    /// table again.
    pub async fn follow(&self, from: &str, hint: Option<String>) {
        if self.shared.routes.borrow().map.is_split() {
            self.shared.refresh_leases().await;
        } else {
            self.shared.follow_leader(from, hint).await;
        }
    }

    pub async fn submit(&self, req: pb::SubmitRequest) -> Result<pb::SubmitResponse, Status> {
        self.learn(&req.run_id, &req.session_key);
        let target = self.shared.session_target(&req.session_key);
        routed!(self.shared, target, req, submit)
            .await
            .map(|(_, r)| r)
    }

    pub async fn get(&self, req: pb::GetRequest) -> Result<pb::GetResponse, Status> {
        self.get_at(req).await.map(|(_, r)| r)
    }

    /// `get`, with the address of the coordinator that answered.
    pub async fn get_at(&self, req: pb::GetRequest) -> Result<(String, pb::GetResponse), Status> {
        let target = self.shared.run_target(&req.run_id).await;
        routed!(self.shared, target, req, get).await
    }

    pub async fn wait(&self, req: pb::WaitRequest) -> Result<pb::WaitResponse, Status> {
        let target = self.shared.run_target(&req.run_id).await;
        routed!(self.shared, target, req, wait)
            .await
            .map(|(_, r)| r)
    }

    pub async fn cancel(&self, req: pb::CancelRequest) -> Result<pb::CancelResponse, Status> {
        let target = match &req.target {
            Some(pb::cancel_request::Target::RunId(run_id)) => self.shared.run_target(run_id).await,
            Some(pb::cancel_request::Target::SessionKey(key)) => self.shared.session_target(key),
            None => Target::Any,
        };
        routed!(self.shared, target, req, cancel)
            .await
            .map(|(_, r)| r)
    }

    /// A session's active runs from its owner; without a session, every
    /// owner's, merged (each run once, oldest first).
    pub async fn list_active(
        &self,
        req: pb::ListActiveRequest,
    ) -> Result<pb::ListActiveResponse, Status> {
        let list = |target| routed!(self.shared, target, req.clone(), list_active);
        if let Some(key) = &req.session_key {
            return list(self.shared.session_target(key)).await.map(|(_, r)| r);
        }
        let map = self.shared.routes.borrow().map.clone();
        if !map.is_split() {
            return list(Target::Any).await.map(|(_, r)| r);
        }
        // One call per owner, to a partition it owns: if it does not
        // answer, the call follows that partition to its next owner.
        let targets: Vec<Target> = map
            .addresses()
            .iter()
            .filter_map(|address| map.partitions_of(address).first().copied())
            .map(Target::Partition)
            .collect();
        let answers = futures::future::try_join_all(targets.into_iter().map(list)).await?;
        Ok(pb::ListActiveResponse {
            runs: merge_active(answers.into_iter().map(|(_, r)| r.runs)),
        })
    }

    pub async fn describe_runtime(
        &self,
        req: pb::DescribeRuntimeRequest,
    ) -> Result<pb::DescribeRuntimeResponse, Status> {
        routed!(self.shared, Target::Any, req, describe_runtime)
            .await
            .map(|(_, r)| r)
    }

    /// One run's events (`filter: run_id`) from its owner. For every run's
    /// events, subscribe to each of `routes().stream_addresses()` with
    /// `client_at` instead: an all-runs stream covers one coordinator.
    pub async fn subscribe(
        &self,
        req: pb::SubscribeRequest,
    ) -> Result<tonic::Streaming<pb::SubscribeResponse>, Status> {
        let target = match &req.filter {
            Some(pb::subscribe_request::Filter::RunId(run_id)) => {
                self.shared.run_target(run_id).await
            }
            _ => Target::Any,
        };
        routed!(self.shared, target, req, subscribe)
            .await
            .map(|(_, r)| r)
    }
}

impl Shared {
    fn client(&self, address: &str) -> anyhow::Result<CoordinatorClient> {
        let mut clients = self.clients.lock().unwrap();
        if let Some(client) = clients.get(address) {
            return Ok(client.clone());
        }
        let client = client_for(address, self.config.keepalive, self.config.tokens.as_ref())?;
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
    fn apply(&self, table: &LeaseTable) {
        let now = Instant::now();
        let map = PartitionMap::from_table(table, now);
        self.routes.send_if_modified(|routes| {
            let changed = !routes.map.same_tenures(&map)
                || routes.map.live_addresses(now) != map.live_addresses(now);
            routes.map = Arc::new(map);
            changed
        });
    }

    async fn refresh_leases(&self) -> Arc<PartitionMap> {
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

    fn switch_to(&self, address: &str) {
        if let Err(err) = self.client(address) {
            tracing::warn!(%address, error = %err, "unusable coordinator address");
            return;
        }
        self.routes.send_if_modified(|routes| {
            if routes.current == address {
                return false;
            }
            tracing::info!(from = %routes.current, to = %address, "following the run coordinator leader");
            address.clone_into(&mut routes.current);
            true
        });
    }

    /// The single-leader rule (see `Router::follow`).
    async fn follow_leader(&self, from: &str, hint: Option<String>) {
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

    fn session_target(&self, session_key: &str) -> Target {
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
    async fn run_target(&self, run_id: &str) -> Target {
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
    fn pick(&self, target: Target, tried: &mut Vec<String>) -> String {
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
    async fn call<T, F, Fut>(&self, target: Target, mut call: F) -> Result<(String, T), Status>
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
async fn watch_leases(
    shared: Weak<Shared>,
    store: RemoteStore,
    interval: Duration,
    stop: CancellationToken,
) {
    let interval_ms = interval.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
    // Between attempts while the watch is not available.
    let pause = interval.max(MIN_REFRESH);
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
                        item = stream.next() => item,
                        () = stop.cancelled() => return,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_common::partition::partition_of;
    use session_store_api::model::Lease;

    /// A router whose store and coordinators are never reached: the tests
    /// feed it lease tables.
    fn router(addresses: &str) -> Router {
        let endpoint = Endpoint::from_static("http://127.0.0.1:9");
        let store = RemoteStore::new(service_channel(
            endpoint.connect_lazy(),
            endpoint.uri(),
            None,
        ));
        let mut config = RouterConfig::new(addresses).unwrap();
        config.lease_watch_interval = Duration::from_secs(3600);
        Router::new(config, store).unwrap()
    }

    fn table(owners: &[&str]) -> LeaseTable {
        LeaseTable {
            partition_count: owners.len() as u32,
            leases: owners
                .iter()
                .enumerate()
                .map(|(p, address)| Lease {
                    partition: p as u32,
                    owner: (!address.is_empty()).then(|| format!("member-{address}")),
                    address: (*address).to_owned(),
                    epoch: 1,
                    expires_at_ms: 60_000,
                })
                .collect(),
            now_ms: 1_000,
        }
    }

    /// A session key of `partition` among `count`.
    fn session_in(partition: u32, count: u32) -> String {
        (0..)
            .map(|n| format!("agent:main:s{n}"))
            .find(|key| partition_of(key, count) == partition)
            .unwrap()
    }

    #[tokio::test]
    async fn before_any_lease_and_with_one_owner_every_call_goes_to_the_followed_one() {
        let router = router("http://seed-a, http://seed-b");
        let shared = &router.shared;
        assert_eq!(router.current_address(), "http://seed-a");
        assert_eq!(shared.session_target("agent:main:main"), Target::Any);
        assert_eq!(shared.pick(Target::Any, &mut Vec::new()), "http://seed-a");
        // All on one owner (its advertised address differs from the seed):
        // the followed coordinator keeps every call, as before partitions.
        shared.apply(&table(&["http://a"; 4]));
        assert_eq!(shared.session_target("agent:main:main"), Target::Any);
        assert_eq!(shared.run_target("never-seen").await, Target::Any);
        assert_eq!(
            shared.pick(Target::Partition(1), &mut Vec::new()),
            "http://seed-a"
        );
        let now = Instant::now();
        assert_eq!(router.routes().stream_addresses(now), ["http://seed-a"]);
        // Following the leader moves that one coordinator.
        shared
            .follow_leader("http://seed-a", Some("http://a".into()))
            .await;
        assert_eq!(router.current_address(), "http://a");
        assert_eq!(router.routes().stream_addresses(now), ["http://a"]);
    }

    #[tokio::test]
    async fn split_partitions_route_by_session_then_fall_back_in_order() {
        let router = router("http://seed-a,http://seed-b");
        let shared = &router.shared;
        shared.apply(&table(&["http://a", "http://b", "http://a", ""]));
        let key = session_in(1, 4);
        assert_eq!(shared.session_target(&key), Target::Partition(1));
        // Not canonical yet: canonicalised first.
        let short = key.trim_start_matches("agent:main:");
        assert_eq!(shared.session_target(short), Target::Partition(1));
        let mut tried = Vec::new();
        assert_eq!(shared.pick(Target::Partition(1), &mut tried), "http://b");
        tried.push("http://b".to_owned());
        assert_eq!(
            shared.pick(Target::Partition(1), &mut tried),
            "http://seed-a"
        );
        tried.push("http://seed-a".to_owned());
        assert_eq!(
            shared.pick(Target::Partition(1), &mut tried),
            "http://seed-b"
        );
        tried.push("http://seed-b".to_owned());
        // Everything tried: from the owner again.
        assert_eq!(shared.pick(Target::Partition(1), &mut tried), "http://b");
        assert!(tried.is_empty());
        // A partition nobody holds goes to the configured addresses.
        assert_eq!(
            shared.pick(Target::Partition(3), &mut Vec::new()),
            "http://seed-a"
        );
        // Any: the live owners first.
        assert_eq!(shared.pick(Target::Any, &mut Vec::new()), "http://a");
        let now = Instant::now();
        assert_eq!(
            router.routes().stream_addresses(now),
            ["http://a", "http://b"]
        );
    }

    #[tokio::test]
    async fn a_run_routes_by_the_session_it_was_learned_with() {
        let router = router("http://seed");
        router
            .shared
            .apply(&table(&["http://a", "http://b", "http://c"]));
        let key = session_in(2, 3);
        router.learn("run-1", key.trim_start_matches("agent:main:"));
        assert_eq!(
            router.shared.run_target("run-1").await,
            Target::Partition(2)
        );
        assert_eq!(router.partition_of_run("run-1"), Some(2));
        router.learn_canonical("run-2", &session_in(0, 3));
        assert_eq!(router.partition_of_run("run-2"), Some(0));
        assert_eq!(router.partition_of_run("run-3"), None);
    }

    #[tokio::test]
    async fn renewals_do_not_wake_the_watchers_a_move_does() {
        let router = router("http://seed");
        let mut watcher = router.watch_routes();
        watcher.borrow_and_update();
        router.shared.apply(&table(&["http://a", "http://b"]));
        assert!(watcher.has_changed().unwrap());
        let before = watcher.borrow_and_update().map.owner(0).unwrap().expires;
        let mut renewed = table(&["http://a", "http://b"]);
        renewed.leases[0].expires_at_ms = 90_000;
        router.shared.apply(&renewed);
        assert!(!watcher.has_changed().unwrap());
        // Taken in all the same: the lease lasts longer now.
        assert!(router.routes().map.owner(0).unwrap().expires > before);
        let mut moved = renewed.clone();
        moved.leases[1].owner = Some("member-c".into());
        moved.leases[1].address = "http://c".into();
        moved.leases[1].epoch = 2;
        router.shared.apply(&moved);
        assert!(watcher.has_changed().unwrap());
        assert_eq!(router.routes().map.addresses(), ["http://a", "http://c"]);
    }
}

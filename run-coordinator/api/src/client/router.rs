//! `Router`: the RunCoordinator API, each call sent to the coordinator that
//! owns the partition of its session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawgate_proto::run_coordinator::v1 as pb;
use session_store_api::SessionKey;
use session_store_api::grpc::client::RemoteStore;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::config::{RouterConfig, Routes};
use super::map::PartitionMap;
use super::routes::{RunRoutes, merge_active};
use super::shared::{CoordinatorClient, Shared, Target, client_for, watch_leases};
use crate::error::{CoordinatorError, CoordinatorResult};
use crate::events::StreamItem;
use crate::grpc::convert::*;
use crate::grpc::status::from_status;
use crate::model::{
    CancelTarget, LaneStats, RunSnapshot, RuntimeInfo, SubmitRequest, Submitted, WaitResult,
};

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

/// A subscription's items, as the coordinator sends them (items of a kind
/// this client does not know are skipped).
pub struct EventStream(tonic::Streaming<pb::SubscribeResponse>);

impl EventStream {
    /// The next item; `None` once the coordinator ended the stream (a
    /// run's stream ends after its last event). Cancel-safe.
    pub async fn next(&mut self) -> CoordinatorResult<Option<StreamItem>> {
        loop {
            match self.0.message().await.map_err(from_status)? {
                None => return Ok(None),
                Some(item) => {
                    if let Some(item) = stream_item_from_pb(item)? {
                        return Ok(Some(item));
                    }
                }
            }
        }
    }
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
            clients.insert(address.clone(), client_for(address, &config)?);
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

    /// Submits a run to the owner of its session (retried through a
    /// failover with the same runId: admission is idempotent by it).
    pub async fn submit(&self, request: SubmitRequest) -> CoordinatorResult<Submitted> {
        self.learn_canonical(&request.run_id, request.session_key.as_str());
        let target = self.shared.session_target(request.session_key.as_str());
        let req = submit_to_pb(request)?;
        let (_, answer) = routed!(self.shared, target, req, submit)
            .await
            .map_err(from_status)?;
        submitted_from_pb(answer)
    }

    /// What is known of a run (`None`: nobody knows it).
    pub async fn get(&self, run_id: &str) -> CoordinatorResult<Option<RunSnapshot>> {
        self.get_at(run_id).await.map(|(_, snapshot)| snapshot)
    }

    /// `get`, with the address of the coordinator that answered.
    pub async fn get_at(&self, run_id: &str) -> CoordinatorResult<(String, Option<RunSnapshot>)> {
        let target = self.shared.run_target(run_id).await;
        let req = pb::GetRequest {
            run_id: run_id.to_owned(),
        };
        let (address, answer) = routed!(self.shared, target, req, get)
            .await
            .map_err(from_status)?;
        Ok((address, answer.snapshot.map(snapshot_from_pb).transpose()?))
    }

    /// Waits up to `timeout_ms` for a run to end.
    pub async fn wait(&self, run_id: &str, timeout_ms: u64) -> CoordinatorResult<WaitResult> {
        let target = self.shared.run_target(run_id).await;
        let req = pb::WaitRequest {
            run_id: run_id.to_owned(),
            timeout_ms,
        };
        let (_, answer) = routed!(self.shared, target, req, wait)
            .await
            .map_err(from_status)?;
        wait_from_pb(answer)
    }

    /// Cancels a run, or every unfinished run of a session, for
    /// `requester`; the runs as the cancel left them.
    pub async fn cancel(
        &self,
        target: CancelTarget,
        requester: &str,
    ) -> CoordinatorResult<Vec<RunSnapshot>> {
        let to = match &target {
            CancelTarget::Run(run_id) => self.shared.run_target(run_id).await,
            CancelTarget::Session(key) => self.shared.session_target(key.as_str()),
        };
        let req = pb::CancelRequest {
            target: Some(cancel_target_to_pb(target)),
            requester: requester.to_owned(),
        };
        let (_, answer) = routed!(self.shared, to, req, cancel)
            .await
            .map_err(from_status)?;
        snapshots_from_pb(answer.runs)
    }

    /// A session's active runs from its owner; without a session, every
    /// owner's, merged (each run once, oldest first).
    pub async fn list_active(
        &self,
        session: Option<&SessionKey>,
    ) -> CoordinatorResult<Vec<RunSnapshot>> {
        let req = pb::ListActiveRequest {
            session_key: session.map(|key| key.as_str().to_owned()),
        };
        let runs = match session {
            Some(key) => {
                let target = self.shared.session_target(key.as_str());
                let (_, answer) = routed!(self.shared, target, req, list_active)
                    .await
                    .map_err(from_status)?;
                answer.runs
            }
            None => {
                let answers = self
                    .each_owner(|target| routed!(self.shared, target, req.clone(), list_active))
                    .await?;
                merge_active(answers.into_iter().map(|r| r.runs))
            }
        };
        snapshots_from_pb(runs)
    }

    /// The global caps and session lanes of every owner, summed: the
    /// cluster's.
    pub async fn describe_lanes(&self) -> CoordinatorResult<LaneStats> {
        let req = pb::DescribeLanesRequest {};
        let answers = self
            .each_owner(|target| routed!(self.shared, target, req, describe_lanes))
            .await?;
        Ok(answers
            .into_iter()
            .map(lanes_from_pb)
            .fold(LaneStats::default(), |sum, one| sum + one))
    }

    /// Asks every owner once (while the partitions are split; else the one
    /// coordinator), each through a partition it owns: if it does not
    /// answer, the call follows that partition to its next owner.
    async fn each_owner<T, F>(&self, call: impl Fn(Target) -> F) -> CoordinatorResult<Vec<T>>
    where
        F: std::future::Future<Output = Result<(String, T), tonic::Status>>,
    {
        let map = self.shared.routes.borrow().map.clone();
        let targets: Vec<Target> = if map.is_split() {
            map.addresses()
                .iter()
                .filter_map(|address| map.partitions_of(address).first().copied())
                .map(Target::Partition)
                .collect()
        } else {
            vec![Target::Any]
        };
        let answers = futures::future::try_join_all(targets.into_iter().map(call))
            .await
            .map_err(from_status)?;
        Ok(answers.into_iter().map(|(_, answer)| answer).collect())
    }

    /// The runtime the coordinators execute runs through, and its models.
    pub async fn describe_runtime(&self) -> CoordinatorResult<RuntimeInfo> {
        let req = pb::DescribeRuntimeRequest {};
        let (_, answer) = routed!(self.shared, Target::Any, req, describe_runtime)
            .await
            .map_err(from_status)?;
        Ok(runtime_from_pb(answer))
    }

    /// One run's events after `from_seq` (of its coordinator's `epoch`;
    /// empty: the current one) from its owner, then live until it ends.
    pub async fn subscribe_run(
        &self,
        run_id: &str,
        from_seq: u64,
        epoch: &str,
    ) -> CoordinatorResult<EventStream> {
        let target = self.shared.run_target(run_id).await;
        let req = pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::RunId(run_id.to_owned())),
            from_seq,
            epoch: epoch.to_owned(),
        };
        let (_, stream) = routed!(self.shared, target, req, subscribe)
            .await
            .map_err(from_status)?;
        Ok(EventStream(stream))
    }

    /// The all-runs stream of the coordinator at `address` (one stream
    /// covers one coordinator: follow each of `routes().stream_addresses()`
    /// for every run's events), from `after` (its epoch and the last
    /// `stream_seq` seen) or live. Not retried elsewhere: the position is
    /// that coordinator's.
    pub async fn subscribe_all_at(
        &self,
        address: &str,
        after: Option<(&str, u64)>,
    ) -> CoordinatorResult<EventStream> {
        let mut client = self
            .client_at(address)
            .map_err(|e| CoordinatorError::Unavailable(e.to_string()))?;
        let (epoch, from_seq) = after.unwrap_or(("", u64::MAX));
        let req = pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::All(true)),
            from_seq,
            epoch: epoch.to_owned(),
        };
        let stream = client.subscribe(req).await.map_err(from_status)?;
        Ok(EventStream(stream.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clawgate_common::partition::partition_of;
    use clawgate_telemetry::service_channel;
    use session_store_api::model::{Lease, LeaseTable};
    use tokio::time::Instant;
    use tonic::transport::Endpoint;

    use super::*;

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

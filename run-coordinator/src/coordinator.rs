//! The coordinator's state and public API. The work is split by concern, an
//! `impl Inner` block each: `admission.rs` (one decision per key), `lanes.rs`
//! (session lanes and the global cap), `control.rs` (wait, cancel, drain),
//! `terminal.rs` (the shared terminal path), `executor.rs` (one run's
//! execution), `recovery.rs` (after taking partitions) and `leader.rs`
//! (lease ownership).
//!
//! Locks: `Inner::state` (lanes, the run table) may be held while taking a
//! run's own lock, never the other way round, and neither is held across an
//! await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use clawgate_common::clock::now_ms;
use prometheus_client::registry::Registry;
use session_store_api::model::{AcquireLeases, OwnerToken, RunRecord};
use session_store_api::{SessionKey, SessionStore};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::CoordinatorConfig;
use crate::events::{EventHub, RunSubscription, StreamSubscription};
use crate::fenced_store::FencedStore;
use crate::metrics::{CoordinatorMetrics, Load};
use crate::ownership::{Ownership, OwnershipConfig, OwnershipMode};
use crate::run::{Phase, Run};
use crate::runtime::AgentRuntime;
use run_coordinator_api::error::{CoordinatorError, CoordinatorResult};
use run_coordinator_api::events::{EventBody, StreamReset};
use run_coordinator_api::model::*;

#[derive(Default)]
pub(crate) struct Lane {
    /// The run holding the session's turn (at most one executes per lane).
    pub(crate) running: Option<String>,
    /// Waiting runs in start order.
    pub(crate) queued: VecDeque<String>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Every run in memory: unfinished ones, and finished ones while the
    /// dedupe cache keeps them.
    pub(crate) runs: HashMap<String, Arc<Run>>,
    pub(crate) lanes: HashMap<SessionKey, Lane>,
    /// Queued runs of all lanes, in start order.
    pub(crate) waiting: VecDeque<String>,
    pub(crate) executing: usize,
    /// Finished runs in the order they finished, for dedupe eviction.
    pub(crate) finished: VecDeque<(Instant, String)>,
    pub(crate) draining: bool,
}

pub(crate) struct Inner {
    /// The store behind `FencedStore`: a STALE_OWNER anywhere ends the tenure.
    pub store: Arc<dyn SessionStore>,
    pub ownership: Arc<Ownership>,
    pub runtime: Arc<dyn AgentRuntime>,
    pub config: CoordinatorConfig,
    pub epoch: String,
    pub hub: Arc<EventHub>,
    pub metrics: CoordinatorMetrics,
    /// Runs admitted and not yet started, against their bound.
    pub queue: Arc<crate::queue::QueueBudget>,
    pub(crate) state: Mutex<State>,
    /// Notified whenever a run finishes (drain waits on it).
    pub(crate) run_finished: Notify,
    /// Ends the lease loop for a handover (`leader.rs`).
    pub(crate) stop_keeping: CancellationToken,
    /// Balanced placement: this member left the registry (a planned stop);
    /// its rounds only renew what it still holds.
    pub(crate) leaving: std::sync::atomic::AtomicBool,
}

/// The run coordinator. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
}

/// The spec stored in a record (a record from an unknown writer gets a
/// minimal one so that it can still be reported).
pub(crate) fn spec_of(record: &RunRecord) -> RunSpec {
    serde_json::from_str(&record.request_json).unwrap_or_else(|_| RunSpec {
        kind: record.kind.clone(),
        message: String::new(),
        queue_mode: QueueMode::Enqueue,
        timeout_ms: None,
        options: serde_json::json!({}),
        requester: String::new(),
        label: None,
        attachments: Vec::new(),
    })
}

impl Coordinator {
    /// Starts a coordinator with a fresh epoch. With static ownership it
    /// takes every partition and recovers the runs an earlier owner left
    /// unfinished (see `recovery.rs`) before it returns.
    pub async fn start(
        store: Arc<dyn SessionStore>,
        runtime: Arc<dyn AgentRuntime>,
        config: CoordinatorConfig,
    ) -> CoordinatorResult<Self> {
        config
            .ownership
            .check()
            .map_err(CoordinatorError::invalid)?;
        let epoch = uuid::Uuid::new_v4().simple().to_string();
        let partition_count = store.list_leases().await?.partition_count;
        let ownership = Arc::new(Ownership::new(
            epoch.clone(),
            partition_count,
            config.ownership.balanced(),
        ));
        let store: Arc<dyn SessionStore> = Arc::new(FencedStore::new(store, ownership.clone()));
        let hub = Arc::new(EventHub::new(epoch.as_str().into(), config.events.clone()));
        let queue = crate::queue::QueueBudget::new(config.max_queued_runs, config.max_queued_bytes);
        let coordinator = Self {
            inner: Arc::new(Inner {
                store,
                ownership,
                runtime,
                config,
                epoch,
                hub,
                metrics: CoordinatorMetrics::default(),
                queue,
                state: Mutex::new(State::default()),
                run_finished: Notify::new(),
                stop_keeping: CancellationToken::new(),
                leaving: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        match coordinator.inner.config.ownership.mode {
            OwnershipMode::Static => coordinator.inner.take_all().await?,
            OwnershipMode::Lease => {
                tokio::spawn(coordinator.inner.clone().keep_leases());
            }
        }
        Ok(coordinator)
    }

    /// This instance's ownership of partitions (its tenure ends on the first
    /// STALE_OWNER; `ownership().lost()` fires then).
    pub fn ownership(&self) -> &Arc<Ownership> {
        &self.inner.ownership
    }

    pub fn epoch(&self) -> &str {
        &self.inner.epoch
    }

    /// Admits a run (or answers for the one its key already names).
    ///
    /// Admission runs to its end in a task of its own, whatever happens to
    /// the caller: a caller that goes away mid-way (a client deadline, a
    /// dropped connection, RST_STREAM) drops only its wait for the answer.
    /// Dropping admission itself half-way would leave the key's placeholder
    /// in the run table with nobody to finish it, and every retry of the key
    /// and every Cancel of its session waiting on it for ever; or a durable
    /// record that this instance never runs.
    pub async fn submit(&self, req: SubmitRequest) -> CoordinatorResult<Submitted> {
        let inner = self.inner.clone();
        let admission = tokio::spawn(
            async move {
                let arrived = std::time::Instant::now();
                let submitted = inner.submit(req).await;
                inner.metrics.submitted(&submitted, arrived);
                submitted
            }
            .in_current_span(),
        );
        admission.await.unwrap_or_else(|failed| {
            Err(CoordinatorError::Internal(format!("admission: {failed}")))
        })
    }

    /// Registers this coordinator's metrics (docs/metrics.md) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let inner = Arc::downgrade(&self.inner);
        self.inner
            .metrics
            .register(registry, move || inner.upgrade().map(|inner| inner.load()));
    }

    /// The run's snapshot, from memory or from its durable record.
    pub async fn get(&self, run_id: &str) -> CoordinatorResult<Option<RunSnapshot>> {
        match self.inner.find(run_id).await? {
            Some(run) => Ok(Some(self.inner.snapshot(&run))),
            None => Ok(None),
        }
    }

    pub async fn wait(&self, run_id: &str, timeout: Duration) -> CoordinatorResult<WaitResult> {
        self.inner.wait(run_id, timeout).await
    }

    pub async fn cancel(&self, target: CancelTarget) -> CoordinatorResult<Vec<RunSnapshot>> {
        self.inner.cancel(target).await
    }

    /// The agent runtime runs execute through.
    pub fn runtime(&self) -> &Arc<dyn AgentRuntime> {
        &self.inner.runtime
    }

    /// Unfinished runs, oldest first.
    pub fn list_active(&self, session: Option<&SessionKey>) -> Vec<RunSnapshot> {
        self.inner.list_active(session)
    }

    /// The global cap and the session lanes, now.
    pub fn lane_stats(&self) -> LaneStats {
        self.inner.lane_stats()
    }

    pub fn subscribe_run(
        &self,
        run_id: &str,
        after_seq: u64,
        epoch: Option<&str>,
    ) -> Result<RunSubscription, StreamReset> {
        if let Some(run) = self.inner.lock().runs.get(run_id).cloned() {
            run.trace.link_current();
        }
        self.inner.hub.subscribe_run(run_id, after_seq, epoch)
    }

    pub fn subscribe_all(
        &self,
        after_stream_seq: u64,
        epoch: Option<&str>,
    ) -> Result<StreamSubscription, StreamReset> {
        self.inner.hub.subscribe_all(after_stream_seq, epoch)
    }

    /// Stops admitting, lets executing runs finish until `deadline`, then
    /// aborts what is left (queued runs stay queued in the store and run
    /// after a restart).
    pub async fn drain(&self, deadline: Duration) {
        self.inner.drain(deadline).await;
    }
}

impl Inner {
    /// Static ownership: takes every partition from whoever holds it (its
    /// next write meets STALE_OWNER), then settles what the earlier owners
    /// left.
    async fn take_all(self: &Arc<Self>) -> CoordinatorResult<()> {
        let grant = self
            .store
            .acquire_leases(AcquireLeases {
                member: self.ownership.member().to_owned(),
                address: self.config.ownership.advertise_address.clone(),
                partitions: Vec::new(),
                ttl_ms: OwnershipConfig::STATIC_TTL.as_millis() as u64,
                steal: true,
            })
            .await?;
        self.ownership.hold(&grant.granted);
        let taken_over = grant.granted.iter().filter(|l| l.epoch > 1).count();
        tracing::info!(
            member = %self.ownership.member(),
            partitions = grant.granted.len(),
            taken_over,
            "took every partition (static ownership)"
        );
        self.recover(None).await?;
        self.ownership.start_serving();
        Ok(())
    }

    /// The owner token of a write to `key`; `None` once the tenure is over
    /// (the store then refuses the write, as it would a stale token).
    pub(crate) fn owner_token(&self, key: &SessionKey) -> Option<OwnerToken> {
        self.ownership.token(key).ok()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub(crate) fn load(&self) -> Load {
        let state = self.lock();
        Load {
            queued: state.waiting.len(),
            executing: state.executing,
            partitions_held: self.ownership.tokens().len(),
        }
    }

    /// Makes a run known to the table (recovery; admission inserts its own).
    pub(crate) fn register(&self, state: &mut State, run: &Arc<Run>) {
        state.runs.insert(run.id.clone(), run.clone());
    }

    pub(crate) fn emit(&self, run: &Run, body: EventBody) {
        self.hub.emit(&run.id, now_ms(), body);
    }

    pub(crate) fn snapshot_locked(&self, state: &State, run: &Run) -> RunSnapshot {
        let position = Self::queue_position(state, run);
        run.snapshot(position, self.hub.last_seq(&run.id))
    }

    pub(crate) fn snapshot(&self, run: &Run) -> RunSnapshot {
        let state = self.lock();
        self.snapshot_locked(&state, run)
    }

    pub(crate) fn evict(&self, state: &mut State) {
        let now = Instant::now();
        while let Some((finished_at, _)) = state.finished.front() {
            let expired = now.duration_since(*finished_at) >= self.config.dedupe_ttl;
            if !expired && state.finished.len() <= self.config.dedupe_capacity {
                break;
            }
            let (_, id) = state.finished.pop_front().expect("checked above");
            // Only finished runs are ever queued here; active ones never go.
            if state
                .runs
                .get(&id)
                .is_some_and(|r| r.state().phase == Phase::Terminal)
            {
                state.runs.remove(&id);
            }
        }
    }

    /// A run in memory, or rebuilt from its durable record.
    pub(crate) async fn find(&self, run_id: &str) -> CoordinatorResult<Option<Arc<Run>>> {
        if let Some(run) = self.lock().runs.get(run_id).cloned() {
            return Ok(Some(run));
        }
        if session_store_api::model::validate_run_id(run_id).is_err() {
            return Ok(None);
        }
        let record = self.store.get_run(run_id).await?;
        Ok(record.map(|record| self.rebuilt(&record)))
    }

    /// A run rebuilt from its durable record. A terminal one's published
    /// snapshot (what Wait and a retried Submit answer) carries the last seq
    /// of its event log while the log is kept, as `Get`'s snapshot does.
    pub(crate) fn rebuilt(&self, record: &RunRecord) -> Arc<Run> {
        let run = Arc::new(Run::from_record(
            record,
            spec_of(record),
            record.owner.clone(),
        ));
        if run.terminal_snapshot().is_some() {
            run.publish_terminal(run.snapshot(0, self.hub.last_seq(&run.id)));
        }
        run
    }
}

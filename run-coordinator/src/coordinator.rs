//! The coordinator: admission, lanes and the global cap, cancel, wait, and
//! the shared terminal path. Execution itself is in `executor.rs`, restart
//! recovery in `recovery.rs`.
//!
//! Locks: `Inner::state` (lanes, the run table) may be held while taking a
//! run's own lock, never the other way round, and neither is held across an
//! await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::registry::Registry;
use session_store::model::{NewRun, RunRecord, RunUpdate};
use session_store::store::now_ms;
use session_store::{SessionKey, SessionStore, StoreError};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::CoordinatorConfig;
use crate::error::{CoordinatorError, CoordinatorResult};
use crate::events::{
    EventBody, EventHub, LifecyclePhase, RunSubscription, StreamReset, StreamSubscription,
};
use crate::metrics::{CoordinatorMetrics, Load};
use crate::model::*;
use crate::run::{Decision, Phase, Run};
use crate::runtime::AgentRuntime;
use crate::trace;

#[derive(Default)]
struct Lane {
    /// The run holding the session's turn (at most one executes per lane).
    running: Option<String>,
    /// Waiting runs in start order.
    queued: VecDeque<String>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Every run in memory: unfinished ones, and finished ones while the
    /// dedupe cache keeps them.
    runs: HashMap<String, Arc<Run>>,
    lanes: HashMap<SessionKey, Lane>,
    /// Queued runs of all lanes, in start order.
    waiting: VecDeque<String>,
    executing: usize,
    /// Finished runs in the order they finished, for dedupe eviction.
    finished: VecDeque<(Instant, String)>,
    draining: bool,
}

pub(crate) struct Inner {
    pub store: Arc<dyn SessionStore>,
    pub runtime: Arc<dyn AgentRuntime>,
    pub config: CoordinatorConfig,
    pub epoch: String,
    pub hub: Arc<EventHub>,
    pub metrics: CoordinatorMetrics,
    state: Mutex<State>,
    /// Notified whenever a run finishes (drain waits on it).
    run_finished: Notify,
}

/// The run coordinator. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
}

/// The digest a retry of the same intent must match.
fn fingerprint(key: &SessionKey, spec: &RunSpec) -> String {
    let canonical = serde_json::json!({
        "kind": spec.kind,
        "session": key.as_str(),
        "message": spec.message,
        "options": spec.options,
        "timeoutMs": spec.timeout_ms,
    });
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
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
    })
}

impl Coordinator {
    /// Starts a coordinator with a fresh epoch and recovers the runs a
    /// previous instance left unfinished (see `recovery.rs`).
    pub async fn start(
        store: Arc<dyn SessionStore>,
        runtime: Arc<dyn AgentRuntime>,
        config: CoordinatorConfig,
    ) -> CoordinatorResult<Self> {
        let epoch = uuid::Uuid::new_v4().simple().to_string();
        let hub = Arc::new(EventHub::new(epoch.as_str().into(), config.events.clone()));
        let coordinator = Self {
            inner: Arc::new(Inner {
                store,
                runtime,
                config,
                epoch,
                hub,
                metrics: CoordinatorMetrics::default(),
                state: Mutex::new(State::default()),
                run_finished: Notify::new(),
            }),
        };
        coordinator.inner.recover().await?;
        Ok(coordinator)
    }

    pub fn epoch(&self) -> &str {
        &self.inner.epoch
    }

    pub async fn submit(&self, req: SubmitRequest) -> CoordinatorResult<Submitted> {
        let arrived = std::time::Instant::now();
        let submitted = self.inner.submit(req).await;
        self.inner.metrics.submitted(&submitted, arrived);
        submitted
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

    /// Unfinished runs, oldest first.
    pub fn list_active(&self, session: Option<&SessionKey>) -> Vec<RunSnapshot> {
        self.inner.list_active(session)
    }

    pub fn subscribe_run(
        &self,
        run_id: &str,
        after_seq: u64,
        epoch: Option<&str>,
    ) -> Result<RunSubscription, StreamReset> {
        if let Some(run) = self.inner.lock().runs.get(run_id).cloned() {
            trace::link_current_to(&run);
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
        self.inner.lock().draining = true;
        let until = Instant::now() + deadline;
        loop {
            let notified = self.inner.run_finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.lock().executing == 0 {
                return;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                break;
            }
        }
        let running: Vec<Arc<Run>> = {
            let state = self.inner.lock();
            state
                .runs
                .values()
                .filter(|run| run.state().phase == Phase::Running)
                .cloned()
                .collect()
        };
        tracing::warn!(
            runs = running.len(),
            "drain deadline reached; aborting running runs"
        );
        for run in &running {
            run.decide(Decision {
                error: Some(RunErrorInfo {
                    kind: "shutdown".into(),
                    message: "the coordinator shut down".into(),
                }),
                ..Decision::aborted()
            });
        }
        for run in running {
            let _ =
                tokio::time::timeout(self.inner.config.cancel_settle, run.wait_terminal()).await;
        }
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn load(&self) -> Load {
        let state = self.lock();
        Load {
            queued: state.waiting.len(),
            executing: state.executing,
        }
    }

    fn validate(&self, req: &SubmitRequest) -> CoordinatorResult<()> {
        session_store::model::validate_run_id(&req.run_id)?;
        let spec = &req.spec;
        if spec.message.trim().is_empty() {
            return Err(CoordinatorError::invalid("message must not be empty"));
        }
        if spec.message.len() > self.config.max_message_bytes {
            return Err(CoordinatorError::invalid(format!(
                "message is {} bytes; the maximum is {}",
                spec.message.len(),
                self.config.max_message_bytes
            )));
        }
        if spec.kind.is_empty() || spec.kind.len() > 64 {
            return Err(CoordinatorError::invalid("kind must be 1..64 characters"));
        }
        if !spec.options.is_object() {
            return Err(CoordinatorError::invalid("options must be a JSON object"));
        }
        if spec.options.to_string().len() > self.config.max_options_bytes {
            return Err(CoordinatorError::invalid(format!(
                "options are larger than {} bytes",
                self.config.max_options_bytes
            )));
        }
        if let Some(ms) = spec.timeout_ms
            && Duration::from_millis(ms) > self.config.max_run_timeout
        {
            return Err(CoordinatorError::invalid(format!(
                "timeoutMs must be at most {}",
                self.config.max_run_timeout.as_millis()
            )));
        }
        Ok(())
    }

    async fn submit(self: &Arc<Self>, req: SubmitRequest) -> CoordinatorResult<Submitted> {
        let span = trace::admit_span(&req.run_id, req.session_key.as_str());
        let submitted = self.submit_traced(req).instrument(span.clone()).await;
        let outcome = match &submitted {
            Ok(done) => match done.admission {
                Admission::Accepted => "accepted",
                Admission::InFlight => "in_flight",
                Admission::Completed => "completed",
            },
            Err(_) => "rejected",
        };
        trace::record_admission(&span, outcome);
        submitted
    }

    async fn submit_traced(self: &Arc<Self>, req: SubmitRequest) -> CoordinatorResult<Submitted> {
        self.validate(&req)?;
        let fingerprint = fingerprint(&req.session_key, &req.spec);
        let run = loop {
            let existing = {
                let mut state = self.lock();
                if state.draining {
                    return Err(CoordinatorError::Draining);
                }
                self.evict(&mut state);
                match state.runs.get(&req.run_id) {
                    Some(run) => run.clone(),
                    None => {
                        if req.spec.queue_mode == QueueMode::Reject
                            && let Some(blocking) = self.lane_blocker(&state, &req.session_key)
                        {
                            let blocking = self.snapshot_locked(&state, &blocking);
                            return Err(CoordinatorError::SessionBusy {
                                blocking: Box::new(blocking),
                            });
                        }
                        let run = Arc::new(Run::new(
                            req.run_id.clone(),
                            req.session_key.clone(),
                            req.spec.clone(),
                            fingerprint.clone(),
                            now_ms(),
                            self.epoch.clone(),
                        ));
                        run.trace.admitted_in(&tracing::Span::current());
                        state.runs.insert(req.run_id.clone(), run.clone());
                        break run;
                    }
                }
            };
            // Another submit of this key is being admitted: its decision is ours.
            existing.admission_done().await;
            let still_there = self
                .lock()
                .runs
                .get(&req.run_id)
                .is_some_and(|r| Arc::ptr_eq(r, &existing));
            if still_there {
                return self.answer_existing(&existing, &fingerprint);
            }
        };
        let admitted = self.admit(&run, &req).await;
        if admitted.is_err()
            || admitted
                .as_ref()
                .is_ok_and(|s| s.admission != Admission::Accepted)
        {
            // The placeholder goes; a run from the record may have replaced it.
            let mut state = self.lock();
            if state
                .runs
                .get(&req.run_id)
                .is_some_and(|r| Arc::ptr_eq(r, &run))
            {
                state.runs.remove(&req.run_id);
            }
        }
        run.mark_admitted();
        admitted
    }

    /// Writes the durable record, then registers the run in its lane.
    async fn admit(
        self: &Arc<Self>,
        run: &Arc<Run>,
        req: &SubmitRequest,
    ) -> CoordinatorResult<Submitted> {
        let request_json = serde_json::to_string(&req.spec)
            .map_err(|e| CoordinatorError::Internal(e.to_string()))?;
        let created = self
            .store
            .create_run(NewRun {
                run_id: req.run_id.clone(),
                session_key: req.session_key.clone(),
                kind: req.spec.kind.clone(),
                fingerprint: run.fingerprint.clone(),
                status: RunStatus::Queued,
                owner: self.epoch.clone(),
                request_json,
            })
            .await?;
        if !created.created {
            // Known to the store but not to this instance's memory: an
            // evicted or pre-restart run. The record answers.
            let record = created.record;
            let known = Arc::new(Run::from_record(
                &record,
                spec_of(&record),
                record.owner.clone(),
            ));
            if created.fingerprint_mismatch {
                return Err(CoordinatorError::KeyReused {
                    existing: Box::new(self.snapshot(&known)),
                });
            }
            let admission = if record.status.is_terminal() {
                let mut state = self.lock();
                state.runs.insert(known.id.clone(), known.clone());
                state.finished.push_back((Instant::now(), known.id.clone()));
                Admission::Completed
            } else {
                Admission::InFlight
            };
            return Ok(Submitted {
                admission,
                snapshot: self.snapshot(&known),
                accepted_at_ms: record.created_at_ms,
            });
        }
        run.state().record_version = created.record.version;
        self.hub.open(&run.id, run.key.as_str());
        let to_start = {
            let mut state = self.lock();
            self.enqueue_queued(&mut state, run);
            self.pump(&mut state)
        };
        let snapshot = self.snapshot(run);
        self.spawn_all(to_start);
        Ok(Submitted {
            admission: Admission::Accepted,
            snapshot,
            accepted_at_ms: run.created_at_ms,
        })
    }

    fn answer_existing(&self, run: &Arc<Run>, fingerprint: &str) -> CoordinatorResult<Submitted> {
        let snapshot = self.snapshot(run);
        if run.fingerprint != fingerprint {
            return Err(CoordinatorError::KeyReused {
                existing: Box::new(snapshot),
            });
        }
        let admission = if snapshot.status.is_terminal() && run.terminal_snapshot().is_some() {
            Admission::Completed
        } else {
            Admission::InFlight
        };
        Ok(Submitted {
            admission,
            accepted_at_ms: run.created_at_ms,
            snapshot: run.terminal_snapshot().unwrap_or(snapshot),
        })
    }

    /// The run that makes a `reject` submit busy, if any.
    fn lane_blocker(&self, state: &State, key: &SessionKey) -> Option<Arc<Run>> {
        let lane = state.lanes.get(key)?;
        let id = lane.running.as_ref().or(lane.queued.front())?;
        state.runs.get(id).cloned()
    }

    /// Makes a run known to the table (recovery; admission inserts its own).
    pub(crate) fn register(&self, state: &mut State, run: &Arc<Run>) {
        state.runs.insert(run.id.clone(), run.clone());
    }

    /// Puts an admitted run in its lane as queued and says so in its event
    /// log, before any executor can emit its start.
    pub(crate) fn enqueue_queued(&self, state: &mut State, run: &Arc<Run>) {
        run.state().phase = Phase::Queued;
        self.enqueue(state, run);
        let queue_position = Self::queue_position(state, run);
        run.trace.queue(&run.id, queue_position);
        trace::status_event(run, RunStatus::Queued);
        self.emit(
            run,
            EventBody::Status {
                status: RunStatus::Queued,
                queue_position,
            },
        );
    }

    /// Puts an admitted run in its lane. `interrupt` supersedes the lane's
    /// running run and goes first.
    fn enqueue(&self, state: &mut State, run: &Arc<Run>) {
        let lane = state.lanes.entry(run.key.clone()).or_default();
        if run.spec.queue_mode == QueueMode::Interrupt {
            if let Some(old_id) = lane.running.take()
                && let Some(old) = state.runs.get(&old_id)
            {
                // The old run keeps its cap slot until its executor is done;
                // the new run takes its fence over.
                old.decide(Decision::superseded(Some(run.id.clone())));
                old.trace.superseded_by(&run.trace);
            }
            let lane = state.lanes.get_mut(&run.key).expect("created above");
            lane.queued.push_front(run.id.clone());
            state.waiting.push_front(run.id.clone());
        } else {
            lane.queued.push_back(run.id.clone());
            state.waiting.push_back(run.id.clone());
        }
    }

    /// Starts every waiting run whose lane is free, in start order, while the
    /// global cap allows. Returns them; the caller spawns their executors.
    pub(crate) fn pump(&self, state: &mut State) -> Vec<Arc<Run>> {
        let mut started = Vec::new();
        if state.draining {
            // Queued runs stay queued in the store for the next instance.
            return started;
        }
        let mut index = 0;
        while state.executing < self.config.max_executing && index < state.waiting.len() {
            let id = state.waiting[index].clone();
            let Some(run) = state.runs.get(&id).cloned() else {
                state.waiting.remove(index);
                continue;
            };
            let lane = state.lanes.entry(run.key.clone()).or_default();
            if lane.running.is_none() && lane.queued.front() == Some(&id) {
                lane.queued.pop_front();
                lane.running = Some(id);
                state.waiting.remove(index);
                state.executing += 1;
                let mut run_state = run.state();
                run_state.phase = Phase::Running;
                run_state.holds_slot = true;
                drop(run_state);
                run.trace.dequeued();
                started.push(run);
            } else {
                index += 1;
            }
        }
        started
    }

    fn spawn_all(self: &Arc<Self>, runs: Vec<Arc<Run>>) {
        for run in runs {
            tokio::spawn(self.clone().execute(run));
        }
    }

    pub(crate) fn emit(&self, run: &Run, body: EventBody) {
        self.hub.emit(&run.id, now_ms(), body);
    }

    fn queue_position(state: &State, run: &Run) -> u32 {
        if run.state().phase != Phase::Queued {
            return 0;
        }
        let Some(lane) = state.lanes.get(&run.key) else {
            return 0;
        };
        let ahead = lane.queued.iter().position(|id| *id == run.id).unwrap_or(0);
        (ahead + usize::from(lane.running.is_some())) as u32
    }

    fn snapshot_locked(&self, state: &State, run: &Run) -> RunSnapshot {
        let position = Self::queue_position(state, run);
        run.snapshot(position, self.hub.last_seq(&run.id))
    }

    pub(crate) fn snapshot(&self, run: &Run) -> RunSnapshot {
        let state = self.lock();
        self.snapshot_locked(&state, run)
    }

    fn evict(&self, state: &mut State) {
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
        if session_store::model::validate_run_id(run_id).is_err() {
            return Ok(None);
        }
        let record = self.store.get_run(run_id).await?;
        Ok(record.map(|record| {
            Arc::new(Run::from_record(
                &record,
                spec_of(&record),
                record.owner.clone(),
            ))
        }))
    }

    async fn wait(&self, run_id: &str, timeout: Duration) -> CoordinatorResult<WaitResult> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(run) = self.find(run_id).await? {
                trace::link_current_to(&run);
                if let Some(done) = run.terminal_snapshot() {
                    return Ok(WaitResult {
                        terminal: true,
                        unknown: false,
                        snapshot: Some(done),
                    });
                }
                let in_memory = self
                    .lock()
                    .runs
                    .get(run_id)
                    .is_some_and(|r| Arc::ptr_eq(r, &run));
                if in_memory {
                    return Ok(
                        match tokio::time::timeout_at(until, run.wait_terminal()).await {
                            Ok(done) => WaitResult {
                                terminal: true,
                                unknown: false,
                                snapshot: Some(done),
                            },
                            Err(_) => WaitResult {
                                terminal: false,
                                unknown: false,
                                snapshot: Some(self.snapshot(&run)),
                            },
                        },
                    );
                }
                // Another instance's run: only its record tells.
                if Instant::now() >= until {
                    return Ok(WaitResult {
                        terminal: false,
                        unknown: false,
                        snapshot: Some(self.snapshot(&run)),
                    });
                }
            } else if Instant::now() >= until {
                return Ok(WaitResult {
                    terminal: false,
                    unknown: true,
                    snapshot: None,
                });
            }
            // Not ours or not known yet: look again shortly.
            tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(100))).await;
        }
    }

    async fn cancel(self: &Arc<Self>, target: CancelTarget) -> CoordinatorResult<Vec<RunSnapshot>> {
        let runs = match &target {
            CancelTarget::Run(id) => self.find(id).await?.into_iter().collect(),
            CancelTarget::Session(key) => {
                let state = self.lock();
                let mut runs: Vec<Arc<Run>> = state
                    .runs
                    .values()
                    .filter(|r| r.key == *key && r.state().phase != Phase::Terminal)
                    .cloned()
                    .collect();
                runs.sort_by_key(|r| r.created_at_ms);
                runs
            }
        };
        let mut snapshots = Vec::with_capacity(runs.len());
        for run in runs {
            snapshots.push(self.cancel_one(&run).await);
        }
        Ok(snapshots)
    }

    async fn cancel_one(self: &Arc<Self>, run: &Arc<Run>) -> RunSnapshot {
        trace::link_current_to(run);
        run.admission_done().await;
        let phase = {
            let mut state = self.lock();
            let phase = run.state().phase;
            if phase == Phase::Queued {
                // Never started: leave the lane; nothing ran, nothing to stop.
                if let Some(lane) = state.lanes.get_mut(&run.key) {
                    lane.queued.retain(|id| *id != run.id);
                }
                state.waiting.retain(|id| *id != run.id);
                run.state().phase = Phase::Finishing;
                run.trace.dequeued();
            }
            phase
        };
        match phase {
            Phase::Queued => {
                run.decide(Decision::aborted());
                self.finish(run).await;
            }
            Phase::Running | Phase::Finishing => {
                run.decide(Decision::aborted());
                let _ = tokio::time::timeout(self.config.cancel_settle, run.wait_terminal()).await;
            }
            Phase::Admitting | Phase::Terminal => {}
        }
        run.terminal_snapshot()
            .unwrap_or_else(|| self.snapshot(run))
    }

    fn list_active(&self, session: Option<&SessionKey>) -> Vec<RunSnapshot> {
        let state = self.lock();
        let mut runs: Vec<&Arc<Run>> = state
            .runs
            .values()
            .filter(|r| session.is_none_or(|k| r.key == *k))
            .filter(|r| {
                matches!(
                    r.state().phase,
                    Phase::Queued | Phase::Running | Phase::Finishing
                )
            })
            .collect();
        runs.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        runs.into_iter()
            .map(|r| self.snapshot_locked(&state, r))
            .collect()
    }

    /// The one terminal path: persist the decision (the record first, so a
    /// crash cannot take back what a waiter saw), emit the end event, publish
    /// the snapshot and free the lane.
    pub(crate) async fn finish(self: &Arc<Self>, run: &Arc<Run>) {
        let decision = run
            .decided()
            .unwrap_or_else(|| Decision::failed("internal", "the run ended without a decision"));
        {
            let mut state = run.state();
            state.phase = Phase::Finishing;
            state.status = decision.status;
            state.ended_at_ms = Some(now_ms());
            if decision.stop_reason.is_some() {
                state.outcome.stop_reason = decision.stop_reason.clone();
            }
            state.outcome.error = decision.error.clone();
            state.outcome.superseded_by = decision.superseded_by.clone();
        }
        self.persist_terminal(run).await;
        let (status, outcome) = {
            let state = run.state();
            (state.status, state.outcome.clone())
        };
        trace::status_event(run, status);
        self.metrics.run_finished(status);
        let phase = if status == RunStatus::Error || status == RunStatus::Lost {
            LifecyclePhase::Error
        } else {
            LifecyclePhase::End
        };
        self.emit(
            run,
            EventBody::Lifecycle {
                phase,
                status: Some(status),
                stop_reason: outcome.stop_reason,
                error: outcome.error,
            },
        );
        self.hub.close(&run.id);
        run.state().phase = Phase::Terminal;
        let snapshot = self.snapshot(run);
        run.publish_terminal(snapshot);
        let to_start = {
            let mut state = self.lock();
            if let Some(lane) = state.lanes.get_mut(&run.key) {
                if lane.running.as_deref() == Some(run.id.as_str()) {
                    lane.running = None;
                }
                lane.queued.retain(|id| *id != run.id);
                if lane.running.is_none() && lane.queued.is_empty() {
                    state.lanes.remove(&run.key);
                }
            }
            let mut run_state = run.state();
            if run_state.holds_slot {
                run_state.holds_slot = false;
                state.executing -= 1;
            }
            drop(run_state);
            state.finished.push_back((Instant::now(), run.id.clone()));
            self.evict(&mut state);
            self.pump(&mut state)
        };
        self.run_finished.notify_waiters();
        self.spawn_all(to_start);
    }

    /// Writes the terminal record, retrying while the store is unavailable.
    /// If the store already holds a terminal (recovery elsewhere decided
    /// first), that one is adopted: terminal is final in the store too.
    async fn persist_terminal(&self, run: &Run) {
        let mut backoff = Duration::from_millis(50);
        for attempt in 1..=8 {
            let update = {
                let state = run.state();
                RunUpdate {
                    run_id: run.id.clone(),
                    expected_version: state.record_version,
                    status: state.status,
                    owner: None,
                    outcome_json: serde_json::to_string(&state.outcome).ok(),
                    session_id: state.session_id.as_deref().and_then(|s| s.parse().ok()),
                    fence_token: state.fence_token,
                }
            };
            match self.store.update_run(update).await {
                Ok(record) => {
                    let mut state = run.state();
                    state.record_version = record.version;
                    state.ended_at_ms = record.ended_at_ms;
                    return;
                }
                Err(StoreError::RunTerminal { current }) => {
                    let adopted = Run::from_record(&current, spec_of(&current), run.epoch.clone());
                    let adopted = adopted.state();
                    let mut state = run.state();
                    state.status = adopted.status;
                    state.outcome = adopted.outcome.clone();
                    state.ended_at_ms = adopted.ended_at_ms;
                    state.record_version = adopted.record_version;
                    return;
                }
                Err(err) => {
                    tracing::warn!(run.id = %run.id, attempt, error = %err, "persisting the terminal state failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        tracing::error!(run.id = %run.id, "the terminal state could not be persisted; a restart will report the run lost");
    }
}

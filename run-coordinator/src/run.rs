//! One run in memory: its request, its cancel handle, its mutable state and
//! the watch that publishes its terminal snapshot.
//!
//! The terminal decision is set once (`decide`); whoever decides first —
//! the executor on success or failure, a cancel, a supersede, the timeout —
//! wins, and nothing decided later changes it. The snapshot is *published*
//! only after the terminal record is durable, so a waiter never sees an
//! outcome that a crash could take back.

use std::sync::Mutex;

use session_store_api::SessionKey;
use session_store_api::model::RunRecord;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::trace::RunTrace;
use run_coordinator_api::model::{Outcome, RunErrorInfo, RunSnapshot, RunSpec, RunStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The durable record is being written; not yet acknowledged.
    Admitting,
    Queued,
    Running,
    /// Terminal decided and being persisted.
    Finishing,
    Terminal,
}

/// A run's terminal decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub status: RunStatus,
    pub stop_reason: Option<String>,
    pub error: Option<RunErrorInfo>,
    pub superseded_by: Option<String>,
}

impl Decision {
    pub fn status(status: RunStatus) -> Self {
        Self {
            status,
            stop_reason: None,
            error: None,
            superseded_by: None,
        }
    }

    pub fn aborted() -> Self {
        Self {
            stop_reason: Some("aborted".into()),
            ..Self::status(RunStatus::Aborted)
        }
    }

    pub fn timed_out() -> Self {
        Self {
            stop_reason: Some("timeout".into()),
            error: Some(RunErrorInfo {
                kind: "timeout".into(),
                message: "the run exceeded its timeout".into(),
            }),
            ..Self::status(RunStatus::Timeout)
        }
    }

    pub fn superseded(by: Option<String>) -> Self {
        Self {
            superseded_by: by,
            ..Self::status(RunStatus::Superseded)
        }
    }

    pub fn failed(kind: &str, message: impl Into<String>) -> Self {
        Self {
            error: Some(RunErrorInfo {
                kind: kind.into(),
                message: message.into(),
            }),
            ..Self::status(RunStatus::Error)
        }
    }
}

#[derive(Debug)]
pub struct RunState {
    pub phase: Phase,
    /// The status the durable record has (or is about to have).
    pub status: RunStatus,
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub decided: Option<Decision>,
    pub outcome: Outcome,
    pub session_id: Option<String>,
    pub fence_token: Option<u64>,
    pub record_version: u64,
    /// Executing counts against the global cap.
    pub holds_slot: bool,
    /// Runs whose messages this run carries (`steer`, `collect`): they end
    /// with it. Untaken ones become turns of their own when it ends.
    pub companions: Vec<Companion>,
    /// The run this one's message went into, while it is a companion.
    pub carried_by: Option<String>,
    /// Its place in the queue's bound while it has not started
    /// (`queue.rs`); given back as it leaves the queue.
    pub queue_charge: Option<crate::queue::QueueCharge>,
}

impl RunState {
    /// Moves to `phase`; a run that starts or is decided leaves the queue.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        if !matches!(phase, Phase::Admitting | Phase::Queued) {
            self.queue_charge = None;
        }
    }
}

/// A run whose message another run carries.
pub struct Companion {
    pub run: std::sync::Arc<Run>,
    /// Its message is in the carrier's turn (written to the transcript).
    pub taken: bool,
}

impl std::fmt::Debug for Companion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Companion")
            .field("run", &self.run.id)
            .field("taken", &self.taken)
            .finish()
    }
}

pub struct Run {
    pub id: String,
    pub key: SessionKey,
    pub spec: RunSpec,
    pub fingerprint: String,
    pub created_at_ms: i64,
    pub epoch: String,
    pub cancel: CancellationToken,
    /// Fires when the run leaves this instance without ending here: a
    /// queued run whose partition was handed to another coordinator.
    pub moved: CancellationToken,
    pub trace: RunTrace,
    /// Messages steered into this run while it runs.
    pub inputs: crate::runtime::Inputs,
    state: Mutex<RunState>,
    terminal: watch::Sender<Option<RunSnapshot>>,
    admitted: watch::Sender<bool>,
}

impl Run {
    pub fn new(
        id: String,
        key: SessionKey,
        spec: RunSpec,
        fingerprint: String,
        created_at_ms: i64,
        epoch: String,
    ) -> Self {
        Self {
            id,
            key,
            spec,
            fingerprint,
            created_at_ms,
            epoch,
            cancel: CancellationToken::new(),
            moved: CancellationToken::new(),
            trace: RunTrace::default(),
            inputs: Default::default(),
            state: Mutex::new(RunState {
                phase: Phase::Admitting,
                status: RunStatus::Queued,
                started_at_ms: None,
                ended_at_ms: None,
                decided: None,
                outcome: Outcome::default(),
                session_id: None,
                fence_token: None,
                record_version: 0,
                holds_slot: false,
                companions: Vec::new(),
                carried_by: None,
                queue_charge: None,
            }),
            terminal: watch::channel(None).0,
            admitted: watch::channel(false).0,
        }
    }

    /// A run known only from its durable record (after eviction or restart).
    pub fn from_record(record: &RunRecord, spec: RunSpec, epoch: String) -> Self {
        let run = Self::new(
            record.run_id.clone(),
            SessionKey::from_stored(record.session_key.clone()),
            spec,
            record.fingerprint.clone(),
            record.created_at_ms,
            epoch,
        );
        {
            let mut state = run.state();
            state.status = record.status;
            state.started_at_ms = record.started_at_ms;
            state.ended_at_ms = record.ended_at_ms;
            state.outcome = record
                .outcome_json
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok())
                .unwrap_or_default();
            state.session_id = record.session_id.map(|id| id.to_string());
            state.fence_token = record.fence_token;
            state.record_version = record.version;
            if record.status.is_terminal() {
                state.set_phase(Phase::Terminal);
            }
        }
        run.mark_admitted();
        if record.status.is_terminal() {
            let snapshot = run.snapshot(0, 0);
            run.publish_terminal(snapshot);
        }
        run
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap()
    }

    /// Records the terminal decision unless one was made already. Returns
    /// whether this call decided.
    pub fn decide(&self, decision: Decision) -> bool {
        let mut state = self.state();
        if state.decided.is_some() || state.phase == Phase::Terminal {
            return false;
        }
        state.decided = Some(decision);
        drop(state);
        self.cancel.cancel();
        true
    }

    /// Replaces the decision: only the terminal path does this, before the
    /// decision is durable or visible (a run that decided `ok` and then
    /// found its fence stale was superseded).
    pub fn overrule(&self, decision: Decision) {
        self.state().decided = Some(decision);
    }

    pub fn decided(&self) -> Option<Decision> {
        self.state().decided.clone()
    }

    pub fn mark_admitted(&self) {
        self.admitted.send_replace(true);
    }

    /// Resolves once the run's admission finished (successfully or not).
    pub async fn admission_done(&self) {
        let mut admitted = self.admitted.subscribe();
        let _ = admitted.wait_for(|done| *done).await;
    }

    pub fn publish_terminal(&self, snapshot: RunSnapshot) {
        self.terminal.send_replace(Some(snapshot));
    }

    pub fn terminal_snapshot(&self) -> Option<RunSnapshot> {
        self.terminal.borrow().clone()
    }

    /// Resolves with the terminal snapshot once published.
    pub async fn wait_terminal(&self) -> RunSnapshot {
        let mut terminal = self.terminal.subscribe();
        let published = terminal
            .wait_for(Option::is_some)
            .await
            .expect("the sender lives as long as the run");
        published.clone().expect("checked by wait_for")
    }

    /// The run as it is now. `queue_position` and `last_seq` come from the
    /// lanes and the event log, which the caller reads.
    ///
    /// A run whose end is decided but not yet durable (finishing) shows as
    /// it was before: its end may never be recorded here (the partition can
    /// move first, and its next owner settle it otherwise), so nobody may
    /// read it as ended before it is.
    pub fn snapshot(&self, queue_position: u32, last_seq: u64) -> RunSnapshot {
        let state = self.state();
        let undecided = state.phase == Phase::Finishing && state.status.is_terminal();
        let (status, ended_at_ms, outcome) = if undecided {
            let status = match state.started_at_ms {
                Some(_) => RunStatus::Running,
                None => RunStatus::Queued,
            };
            let outcome = Outcome {
                text: state.outcome.text.clone(),
                ..Outcome::default()
            };
            (status, None, outcome)
        } else {
            (state.status, state.ended_at_ms, state.outcome.clone())
        };
        RunSnapshot {
            run_id: self.id.clone(),
            session_key: self.key.as_str().to_owned(),
            kind: self.spec.kind.clone(),
            status,
            queue_position,
            last_seq,
            created_at_ms: self.created_at_ms,
            started_at_ms: state.started_at_ms,
            ended_at_ms,
            outcome,
            session_id: state.session_id.clone(),
            fence_token: state.fence_token,
            epoch: self.epoch.clone(),
            requester: self.spec.requester.clone(),
        }
    }
}

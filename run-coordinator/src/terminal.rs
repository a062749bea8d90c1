//! The one terminal path: a decision becomes durable, then visible (end
//! event, published snapshot), and the lane and cap slot are freed.

use std::sync::Arc;
use std::time::Duration;

use clawgate_common::clock::now_ms;
use session_store_api::model::{FinishRun, RunUpdate};
use session_store_api::{SessionStore, StoreError};
use tokio::time::Instant;

use crate::coordinator::{Inner, spec_of};
use crate::entries::{current_writer, stale};
use crate::executor::LastWrite;
use crate::run::{Decision, Phase, Run};
use run_coordinator_api::events::{EventBody, LifecyclePhase};
use run_coordinator_api::model::*;

impl Inner {
    /// The one terminal path: persist the decision (the record first, so a
    /// crash cannot take back what a waiter saw), emit the end event, publish
    /// the snapshot and free the lane.
    pub(crate) async fn finish(self: &Arc<Self>, run: &Arc<Run>) {
        self.finish_with(run, None).await;
    }

    /// `finish`, writing the run's last entries and releasing its fence in
    /// the terminal record's commit.
    pub(crate) async fn finish_with(self: &Arc<Self>, run: &Arc<Run>, last: Option<LastWrite>) {
        let decision = run
            .decided()
            .unwrap_or_else(|| Decision::failed("internal", "the run ended without a decision"));
        run.state().set_phase(Phase::Finishing);
        settle(run, &decision);
        if !self.persist_terminal(run, last).await {
            self.give_up(run);
            return;
        }
        let decision = run.decided().unwrap_or(decision);
        let (status, outcome) = {
            let state = run.state();
            (state.status, state.outcome.clone())
        };
        let outcome_text = outcome.text.clone();
        run.trace.status_event(status);
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
        run.state().set_phase(Phase::Terminal);
        let snapshot = self.snapshot(run);
        run.publish_terminal(snapshot);
        // The runs it carried: those whose message it took end with it; a
        // steered one it never took is the lane's next turn.
        run.inputs.close();
        let companions = std::mem::take(&mut run.state().companions);
        let (taken, untaken): (Vec<_>, Vec<_>) = companions
            .into_iter()
            .filter(|c| c.run.state().phase != Phase::Terminal)
            .partition(|c| c.taken);
        let to_start = {
            let mut state = self.lock();
            let untaken: Vec<Arc<Run>> = untaken.into_iter().map(|c| c.run).collect();
            self.requeue_untaken(&mut state, untaken);
            Self::leave_lane(&mut state, run);
            state.finished.push_back((Instant::now(), run.id.clone()));
            self.evict(&mut state);
            self.pump(&mut state)
        };
        self.run_finished.notify_waiters();
        self.spawn_all(to_start);
        for companion in taken {
            let carried = &companion.run;
            {
                let mut state = carried.state();
                state.outcome.text.clone_from(&outcome_text);
                if state.started_at_ms.is_none() {
                    state.started_at_ms = Some(now_ms());
                }
            }
            carried.decide(Decision {
                superseded_by: None,
                ..decision.clone()
            });
            Box::pin(self.finish(carried)).await;
        }
    }

    /// The run's partition is no longer this instance's (the store refused
    /// its terminal with STALE_OWNER): the next owner settles the run
    /// (`lost`), so nothing of this instance's decision may reach anyone as
    /// the run's end. Its lane and cap slot are freed; its event log goes
    /// (subscribers end without an end event) and waiters read the record.
    fn give_up(self: &Arc<Self>, run: &Arc<Run>) {
        clawgate_telemetry::limited!(warn, run.id = %run.id, "the run's partition moved before its end was recorded; its next owner settles it");
        run.inputs.close();
        let companions = std::mem::take(&mut run.state().companions);
        let to_start = {
            let mut state = self.lock();
            Self::leave_lane(&mut state, run);
            for run in std::iter::once(run).chain(companions.iter().map(|c| &c.run)) {
                state.runs.remove(&run.id);
            }
            self.pump(&mut state)
        };
        for run in std::iter::once(run).chain(companions.iter().map(|c| &c.run)) {
            self.moved_away(run);
        }
        self.run_finished.notify_waiters();
        self.spawn_all(to_start);
    }

    /// Writes the terminal record (with the run's last entries and the
    /// release of its fence, in one commit), retrying while the store is
    /// unavailable, for as long as this instance holds the run's partition.
    /// `false`: it did not become durable here (refused with STALE_OWNER, or
    /// the tenure ended): the partition's next owner settles the run. If the store already holds a terminal (recovery
    /// elsewhere decided first), that one is adopted: terminal is final in
    /// the store too. If the fence is stale, the entries cannot be written:
    /// the terminal goes alone, and a run that decided `ok` on them was
    /// superseded instead.
    async fn persist_terminal(&self, run: &Run, mut last: Option<LastWrite>) -> bool {
        let mut backoff = Duration::from_millis(50);
        let partition = self.ownership.partition(&run.key);
        for attempt in 1.. {
            let written = match &last {
                Some(write) => {
                    let finish = self.finish_request(run, write);
                    self.store.finish_run(finish).await.map(|done| done.record)
                }
                None => self.store.update_run(self.terminal_update(run)).await,
            };
            match written {
                Err(err) if last.is_some() && stale(&err) => {
                    let write = last.take().expect("checked above");
                    if write.decided_ok {
                        let superseded = Decision::superseded(current_writer(&err));
                        run.overrule(superseded.clone());
                        settle(run, &superseded);
                    }
                    continue;
                }
                Ok(record) => {
                    let mut state = run.state();
                    state.record_version = record.version;
                    state.ended_at_ms = record.ended_at_ms;
                    return true;
                }
                Err(StoreError::RunTerminal { current }) => {
                    adopt_terminal(run, &current);
                    return true;
                }
                Err(StoreError::RunVersionConflict { current, .. }) => {
                    if current.status.is_terminal() {
                        adopt_terminal(run, &current);
                        return true;
                    }
                    // A write of this instance's whose answer was lost (a
                    // cut connection, a timeout) landed after all: go on
                    // from the version it made. Another owner's version is
                    // that owner's to end.
                    if current.owner != self.epoch {
                        return false;
                    }
                    run.state().record_version = current.version;
                }
                // The tenure is over: the partition's new owner settles the
                // run (recovery marks it lost), so there is nothing to retry.
                Err(StoreError::StaleOwner { .. }) => return false,
                // Retried for as long as the partition is this instance's:
                // an end nobody can read back must not reach anyone.
                Err(_) if !self.ownership.holds(partition) => return false,
                Err(err) => {
                    clawgate_telemetry::limited!(warn, run.id = %run.id, attempt, error = %err, "persisting the terminal state failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        unreachable!("the loop only returns")
    }

    fn terminal_update(&self, run: &Run) -> RunUpdate {
        let state = run.state();
        RunUpdate {
            run_id: run.id.clone(),
            expected_version: state.record_version,
            status: state.status,
            owner: None,
            outcome_json: serde_json::to_string(&state.outcome).ok(),
            session_id: state.session_id.as_deref().and_then(|s| s.parse().ok()),
            fence_token: state.fence_token,
            owner_token: self.owner_token(&run.key),
        }
    }

    /// `terminal_update` with the run's last entries and its fence.
    fn finish_request(&self, run: &Run, write: &LastWrite) -> FinishRun {
        let update = self.terminal_update(run);
        FinishRun {
            run_id: update.run_id,
            key: run.key.clone(),
            expected_version: update.expected_version,
            status: update.status,
            outcome_json: update.outcome_json,
            writer: Some(write.fence),
            entries: write.entries.clone(),
            owner_token: update.owner_token,
        }
    }
}

/// Takes the terminal the store already holds (recovery elsewhere decided
/// first): terminal is final in the store too.
fn adopt_terminal(run: &Run, current: &session_store_api::model::RunRecord) {
    let adopted = Run::from_record(current, spec_of(current), run.epoch.clone());
    let adopted = adopted.state();
    let mut state = run.state();
    state.status = adopted.status;
    state.outcome = adopted.outcome.clone();
    state.ended_at_ms = adopted.ended_at_ms;
    state.record_version = adopted.record_version;
}

/// The decision as the run's state shows it, from now until it is terminal.
fn settle(run: &Run, decision: &Decision) {
    let mut state = run.state();
    state.status = decision.status;
    state.ended_at_ms = Some(now_ms());
    if decision.stop_reason.is_some() {
        state.outcome.stop_reason = decision.stop_reason.clone();
    }
    state.outcome.error = decision.error.clone();
    state.outcome.superseded_by = decision.superseded_by.clone();
}

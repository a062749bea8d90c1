//! Acting on admitted runs: wait for a terminal, cancel one run or a
//! session's runs, and drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::coordinator::Inner;
use crate::run::{Decision, Phase, Run};
use run_coordinator_api::error::CoordinatorResult;
use run_coordinator_api::model::*;

impl Inner {
    pub(crate) async fn wait(
        &self,
        run_id: &str,
        timeout: Duration,
    ) -> CoordinatorResult<WaitResult> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(run) = self.find(run_id).await? {
                run.trace.link_current();
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
                    let waited = tokio::select! {
                        waited = tokio::time::timeout_at(until, run.wait_terminal()) => waited,
                        // Handed to another coordinator: its record tells.
                        () = run.moved.cancelled() => continue,
                    };
                    return Ok(match waited {
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
                    });
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

    pub(crate) async fn cancel(
        self: &Arc<Self>,
        target: CancelTarget,
    ) -> CoordinatorResult<Vec<RunSnapshot>> {
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
        run.trace.link_current();
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
                run.state().set_phase(Phase::Finishing);
                run.trace.dequeued();
            }
            phase
        };
        // A companion (its message rides on another run) has no executor of
        // its own: it ends here, the run carrying it goes on.
        let companion = run.state().carried_by.is_some();
        match phase {
            Phase::Queued => {
                run.decide(Decision::aborted());
                self.finish(run).await;
            }
            Phase::Running if companion => {
                if run.decide(Decision::aborted()) {
                    self.finish(run).await;
                }
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

    /// Stops admitting, lets executing runs finish until `deadline`, then
    /// aborts what is left (queued runs stay queued in the store and run
    /// after a restart).
    pub(crate) async fn drain(&self, deadline: Duration) {
        self.lock().draining = true;
        let until = Instant::now() + deadline;
        if self.settles_by(until, |state| state.executing == 0).await {
            return;
        }
        let running: Vec<Arc<Run>> = {
            let state = self.lock();
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
        self.abort_all(running, "shutdown", "the coordinator shut down")
            .await;
    }

    /// Waits, as runs finish, until `settled` holds or `until` passes.
    /// Returns whether it held.
    pub(crate) async fn settles_by(
        &self,
        until: Instant,
        settled: impl Fn(&crate::coordinator::State) -> bool,
    ) -> bool {
        loop {
            let notified = self.run_finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if settled(&self.lock()) {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Aborts `runs` with an error of `kind`, then gives each the cancel
    /// settle time to record its end.
    pub(crate) async fn abort_all(&self, runs: Vec<Arc<Run>>, kind: &str, message: &str) {
        for run in &runs {
            run.decide(Decision {
                error: Some(RunErrorInfo {
                    kind: kind.into(),
                    message: message.into(),
                }),
                ..Decision::aborted()
            });
        }
        for run in runs {
            let _ = tokio::time::timeout(self.config.cancel_settle, run.wait_terminal()).await;
        }
    }
}

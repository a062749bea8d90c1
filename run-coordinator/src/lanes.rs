//! Session lanes and the global cap: at most one run of a session executes
//! at a time, runs of a lane start in order (`interrupt` goes first and
//! supersedes the running one), and at most `max_executing` run at once.

use std::sync::Arc;

use session_store_api::SessionKey;

use crate::coordinator::{Inner, State};
use crate::events::EventBody;
use crate::model::*;
use crate::run::{Decision, Phase, Run};
use crate::trace;

impl Inner {
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

    pub(crate) fn spawn_all(self: &Arc<Self>, runs: Vec<Arc<Run>>) {
        for run in runs {
            tokio::spawn(self.clone().execute(run));
        }
    }

    pub(crate) fn queue_position(state: &State, run: &Run) -> u32 {
        if run.state().phase != Phase::Queued {
            return 0;
        }
        let Some(lane) = state.lanes.get(&run.key) else {
            return 0;
        };
        let ahead = lane.queued.iter().position(|id| *id == run.id).unwrap_or(0);
        (ahead + usize::from(lane.running.is_some())) as u32
    }

    pub(crate) fn list_active(&self, session: Option<&SessionKey>) -> Vec<RunSnapshot> {
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
}

//! Session lanes and the global cap: at most one run of a session executes
//! at a time, runs of a lane start in order (`interrupt` goes first and
//! supersedes the running one), and at most `max_executing` run at once.
//!
//! Two queue modes let a run ride on another instead of taking a turn:
//! `steer` offers its message to the lane's running run (whose runtime may
//! take it at its next model boundary), and `collect` runs waiting in a row
//! at the front of the lane start as one turn. Such a run is the other's
//! companion: it ends when its carrier does, with the carrier's outcome.
//! A steered message the runtime never took is put back at the front of
//! the lane when its carrier ends, so it becomes the next turn: nothing is
//! lost, and the lane's order stays the arrival order.

use std::sync::Arc;

use session_store_api::SessionKey;

use crate::coordinator::{Inner, State};
use crate::run::{Companion, Decision, Phase, Run};
use run_coordinator_api::events::EventBody;
use run_coordinator_api::model::*;

impl Inner {
    /// Puts an admitted run in its lane as queued and says so in its event
    /// log, before any executor can emit its start.
    pub(crate) fn enqueue_queued(&self, state: &mut State, run: &Arc<Run>) {
        run.state().phase = Phase::Queued;
        if run.spec.queue_mode == QueueMode::Steer && self.steer(state, run) {
            run.trace.status_event(RunStatus::Queued);
            self.emit(
                run,
                EventBody::Status {
                    status: RunStatus::Queued,
                    queue_position: 0,
                },
            );
            return;
        }
        self.enqueue(state, run);
        let queue_position = Self::queue_position(state, run);
        run.trace.queue(&run.id, queue_position);
        run.trace.status_event(RunStatus::Queued);
        self.emit(
            run,
            EventBody::Status {
                status: RunStatus::Queued,
                queue_position,
            },
        );
    }

    /// Offers a `steer` run's message to its lane's running run; `false`
    /// when none runs that takes input (the run then queues as a turn).
    fn steer(&self, state: &mut State, run: &Arc<Run>) -> bool {
        let Some(carrier) = state
            .lanes
            .get(&run.key)
            .and_then(|lane| lane.running.as_ref())
            .and_then(|id| state.runs.get(id))
            .cloned()
        else {
            return false;
        };
        // A steered message is text: one with attachments takes a turn.
        if !run.spec.attachments.is_empty()
            || carrier.decided().is_some()
            || carrier.state().phase != Phase::Running
        {
            return false;
        }
        let offered = carrier.inputs.push(crate::runtime::SteerInput {
            id: run.id.clone(),
            message: run.spec.message.clone(),
        });
        if offered {
            carrier.state().companions.push(Companion {
                run: run.clone(),
                taken: false,
            });
            run.state().carried_by = Some(carrier.id.clone());
        }
        offered
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
            // A partition being handed off starts nothing: its queued runs
            // stay queued in the store for the next owner.
            if !self.ownership.may_start(self.ownership.partition(&run.key)) {
                index += 1;
                continue;
            }
            let lane = state.lanes.entry(run.key.clone()).or_default();
            if lane.running.is_none() && lane.queued.front() == Some(&id) {
                lane.queued.pop_front();
                lane.running = Some(id);
                state.waiting.remove(index);
                state.executing += 1;
                let mut run_state = run.state();
                run_state.set_phase(Phase::Running);
                run_state.holds_slot = true;
                drop(run_state);
                run.trace.dequeued();
                if run.spec.queue_mode == QueueMode::Collect {
                    Self::collect(state, &run);
                }
                started.push(run);
            } else {
                index += 1;
            }
        }
        started
    }

    /// Folds the `collect` runs queued right behind `carrier` into its turn.
    fn collect(state: &mut State, carrier: &Arc<Run>) {
        let Some(lane) = state.lanes.get_mut(&carrier.key) else {
            return;
        };
        while let Some(next) = lane
            .queued
            .front()
            .and_then(|id| state.runs.get(id))
            .filter(|r| r.spec.queue_mode == QueueMode::Collect && r.decided().is_none())
            .cloned()
        {
            lane.queued.pop_front();
            state.waiting.retain(|id| *id != next.id);
            {
                let mut next_state = next.state();
                next_state.set_phase(Phase::Running);
                next_state.carried_by = Some(carrier.id.clone());
            }
            carrier.state().companions.push(Companion {
                run: next,
                taken: true,
            });
        }
    }

    /// Puts a carrier's untaken companions back at the front of its lane,
    /// in arrival order, as turns of their own.
    pub(crate) fn requeue_untaken(&self, state: &mut State, untaken: Vec<Arc<Run>>) {
        for run in untaken.into_iter().rev() {
            run.state().carried_by = None;
            let lane = state.lanes.entry(run.key.clone()).or_default();
            lane.queued.push_front(run.id.clone());
            state.waiting.push_front(run.id.clone());
        }
    }

    /// Frees the lane turn and the cap slot `run` holds, if any (its end,
    /// recorded or given up).
    pub(crate) fn leave_lane(state: &mut State, run: &Run) {
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
    }

    /// `run` leaves this instance without ending here (its partition moved):
    /// its event log goes, so its subscribers end, and its waiters go on
    /// from the record.
    pub(crate) fn moved_away(&self, run: &Run) {
        self.hub.forget(&run.id);
        run.moved.cancel();
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
        // Searched from the back: a run just queued (every admission's
        // snapshot) is found at once, however long its lane.
        let ahead = lane
            .queued
            .iter()
            .rposition(|id| *id == run.id)
            .unwrap_or(0);
        (ahead + usize::from(lane.running.is_some())) as u32
    }

    /// The global cap and the session lanes, now.
    pub(crate) fn lane_stats(&self) -> LaneStats {
        let state = self.lock();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let lanes = state.lanes.values();
        LaneStats {
            max_executing: count(self.config.max_executing),
            executing: count(state.executing),
            waiting: count(state.waiting.len()),
            draining: state.draining,
            lanes: count(state.lanes.len()),
            lanes_running: count(lanes.clone().filter(|l| l.running.is_some()).count()),
            lanes_waiting: count(lanes.filter(|l| !l.queued.is_empty()).count()),
        }
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

//! Restart recovery. A coordinator owns the lanes of the sessions it serves;
//! on start it settles every unfinished run an earlier instance left:
//!
//! * a run that was executing is over: it becomes terminal `lost` (the
//!   reason says why) and its fence is taken over and released, so a zombie
//!   executor of the old instance can no longer write;
//! * a run that never started is queued again, in its original order, and
//!   runs exactly once (its record moves to this instance's epoch by CAS, so
//!   two instances cannot both pick it up).
//!
//! Only runs of the partitions this instance has just taken are settled; the
//! take bumped their epochs, so the instance that ran them before can no
//! longer write (its writes meet `STALE_OWNER`), and every write it made
//! before the take is visible here.

use std::sync::Arc;

use session_store_api::SessionKey;
use session_store_api::model::{AcquireMode, AcquireWriter, ExpectedSession, RunRecord, RunUpdate};

use crate::coordinator::{Inner, spec_of};
use crate::run::{Phase, Run};
use run_coordinator_api::error::CoordinatorResult;
use run_coordinator_api::model::{Outcome, RunErrorInfo, RunStatus};

impl Inner {
    /// Settles the unfinished runs of the held partitions (`only`: of these
    /// partitions) that this instance's memory does not hold: an earlier
    /// owner's, or its own from a tenure it gave up (queued runs it left in
    /// the store on a handoff).
    pub(crate) async fn recover(self: &Arc<Self>, only: Option<&[u32]>) -> CoordinatorResult<()> {
        let records = self.store.list_active_runs(None).await?;
        let (mut lost, mut requeued) = (0, 0);
        let (running, waiting): (Vec<RunRecord>, Vec<RunRecord>) = records
            .into_iter()
            .filter(|record| {
                let key = SessionKey::from_stored(record.session_key.clone());
                let partition = self.ownership.partition(&key);
                only.is_none_or(|only| only.contains(&partition))
                    && self.ownership.holds(partition)
                    && !self.is_live(&record.run_id)
            })
            .partition(|record| record.status == RunStatus::Running);
        // Every executing run is settled (its fence freed) before a queued
        // one may start: an `interrupt` run can be executing ahead of older
        // queued runs of its session, which would otherwise find the
        // session's writer slot still held.
        for record in &running {
            self.mark_lost(record).await?;
            lost += 1;
        }
        for record in waiting {
            if self.requeue(record).await? {
                requeued += 1;
            }
        }
        if lost + requeued > 0 {
            tracing::info!(lost, requeued, epoch = %self.epoch, "recovered runs of an earlier instance");
        }
        Ok(())
    }

    /// Whether the run is this instance's and not finished.
    fn is_live(&self, run_id: &str) -> bool {
        self.lock()
            .runs
            .get(run_id)
            .is_some_and(|run| run.state().phase != Phase::Terminal)
    }

    async fn mark_lost(&self, record: &RunRecord) -> CoordinatorResult<()> {
        let key = SessionKey::from_stored(record.session_key.clone());
        let outcome = Outcome {
            error: Some(RunErrorInfo {
                kind: "lost".into(),
                message: format!(
                    "the coordinator instance {} executing this run stopped before it finished",
                    record.owner
                ),
            }),
            ..Outcome::default()
        };
        let update = RunUpdate {
            run_id: record.run_id.clone(),
            expected_version: record.version,
            status: RunStatus::Lost,
            owner: Some(self.epoch.clone()),
            outcome_json: serde_json::to_string(&outcome).ok(),
            session_id: None,
            fence_token: None,
            owner_token: self.owner_token(&key),
        };
        match self.store.update_run(update).await {
            Ok(_) => self.metrics.run_finished(RunStatus::Lost),
            // Settled meanwhile by someone else: nothing left to do.
            Err(session_store_api::StoreError::RunVersionConflict { .. })
            | Err(session_store_api::StoreError::RunTerminal { .. }) => return Ok(()),
            Err(err) => return Err(err.into()),
        }
        // Take the fence from the lost run (only if it still holds it), then
        // free the slot: its old executor's writes are now rejected.
        let marker = format!("recovery-{}", self.epoch);
        let taken = self
            .store
            .acquire_writer(AcquireWriter {
                key: key.clone(),
                expected_session: ExpectedSession::Current,
                expected_writer: Some(record.run_id.clone()),
                run_id: marker.clone(),
                mode: AcquireMode::Cas,
                label: None,
                owner_token: self.owner_token(&key),
            })
            .await;
        if let Ok(taken) = taken {
            self.store
                .release_writer(
                    &key,
                    &marker,
                    taken.fence_token,
                    self.owner_token(&key).as_ref(),
                )
                .await?;
        }
        Ok(())
    }

    /// Queues a never-started run again. Returns false when another instance
    /// claimed it first.
    async fn requeue(self: &Arc<Self>, record: RunRecord) -> CoordinatorResult<bool> {
        let update = RunUpdate {
            run_id: record.run_id.clone(),
            expected_version: record.version,
            status: RunStatus::Queued,
            owner: Some(self.epoch.clone()),
            outcome_json: None,
            session_id: None,
            fence_token: None,
            owner_token: self.owner_token(&SessionKey::from_stored(record.session_key.clone())),
        };
        let claimed = match self.store.update_run(update).await {
            Ok(claimed) => claimed,
            Err(session_store_api::StoreError::RunVersionConflict { .. })
            | Err(session_store_api::StoreError::RunTerminal { .. }) => return Ok(false),
            Err(err) => return Err(err.into()),
        };
        let run = Arc::new(Run::from_record(
            &claimed,
            spec_of(&claimed),
            self.epoch.clone(),
        ));
        self.hub.open(&run.id, run.key.as_str());
        let to_start = {
            let mut state = self.lock();
            self.register(&mut state, &run);
            self.enqueue_queued(&mut state, &run);
            self.pump(&mut state)
        };
        for run in to_start {
            tokio::spawn(self.clone().execute(run));
        }
        Ok(true)
    }
}

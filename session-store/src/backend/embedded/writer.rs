//! The embedded store's one writer thread and its group commit, with two
//! lanes so that admission never waits behind execution.
//!
//! Writes wait in one of two lanes. Each group takes every waiting write of
//! the **urgent** lane first (a run's admission, `CreateRun`, which the
//! client's ACK waits for; lease takes and renewals, which keep ownership;
//! member heartbeats, which keep a coordinator in the registry) and then
//! fills up from the **bulk** lane (everything else: the writes of
//! executing runs, session changes) to `max_batch`, applies them in that
//! order inside one write transaction and commits once (fsync). A write is
//! answered only after its group committed, so every acknowledged write is
//! durable in either lane; the lanes decide only which writes the next
//! commit carries. However long the bulk lane gets, an urgent write waits
//! at most for the commit in progress and its own.
//!
//! The lanes share one bound (`queue_depth`): a caller waits for room
//! before its write is queued, so a flood of writes holds callers back
//! instead of growing memory.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use redb::{Database, WriteTransaction};
use tokio::sync::Semaphore;

use crate::error::StoreError;
use clawgate_common::clock::now_ms;

/// Answers a caller once the group its write belongs to has committed.
pub(super) type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// One write: applied to the group's transaction; `Err` poisons the group.
pub(super) type Job =
    Box<dyn FnOnce(&WriteTransaction, i64) -> (Completion, Result<(), redb::Error>) + Send>;

/// Which lane a write waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Admission, lease and member-registry writes: first in every group.
    Urgent,
    /// Everything else.
    Bulk,
}

#[derive(Default)]
struct Lanes {
    urgent: VecDeque<Job>,
    bulk: VecDeque<Job>,
    closed: bool,
}

/// The writes waiting for the writer thread.
pub(super) struct WriteQueue {
    lanes: Mutex<Lanes>,
    ready: Condvar,
    /// Free places among the `queue_depth` a queue holds.
    room: Semaphore,
}

impl WriteQueue {
    pub(super) fn new(queue_depth: usize) -> Self {
        Self {
            lanes: Mutex::default(),
            ready: Condvar::new(),
            room: Semaphore::new(queue_depth.max(1)),
        }
    }

    /// Queues `job` once there is room. Fails when the writer has stopped.
    pub(super) async fn push(&self, lane: Lane, job: Job) -> Result<(), StoreError> {
        let stopped = || StoreError::Unavailable("the store writer has stopped".into());
        // The place is given back by the writer when it takes the job.
        self.room.acquire().await.map_err(|_| stopped())?.forget();
        let mut lanes = self.lanes.lock().expect("the write queue lock");
        if lanes.closed {
            return Err(stopped());
        }
        match lane {
            Lane::Urgent => lanes.urgent.push_back(job),
            Lane::Bulk => lanes.bulk.push_back(job),
        }
        drop(lanes);
        self.ready.notify_one();
        Ok(())
    }

    /// Stops the writer once the writes already queued are committed.
    pub(super) fn close(&self) {
        self.lanes.lock().expect("the write queue lock").closed = true;
        self.room.close();
        self.ready.notify_all();
    }

    /// The next group: waits for a write, then takes the urgent lane first
    /// and the bulk lane after it, at most `max_batch` in all. Empty: closed
    /// with nothing left.
    fn next_group(&self, max_batch: usize, group: &mut Vec<Job>) {
        let mut lanes = self.lanes.lock().expect("the write queue lock");
        while lanes.urgent.is_empty() && lanes.bulk.is_empty() && !lanes.closed {
            lanes = self.ready.wait(lanes).expect("the write queue lock");
        }
        let urgent = lanes.urgent.len().min(max_batch);
        group.extend(lanes.urgent.drain(..urgent));
        let bulk = lanes.bulk.len().min(max_batch - group.len());
        group.extend(lanes.bulk.drain(..bulk));
        drop(lanes);
        self.room.add_permits(group.len());
    }
}

/// The writer thread: commits groups until the queue is closed and empty.
pub(super) fn run_writer(db: &Database, queue: &WriteQueue, max_batch: usize) {
    let mut group = Vec::with_capacity(max_batch);
    loop {
        queue.next_group(max_batch, &mut group);
        if group.is_empty() {
            return;
        }
        commit_group(db, &mut group);
    }
}

fn commit_group(db: &Database, group: &mut Vec<Job>) {
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => {
            // The jobs never ran: dropping them answers their callers with
            // "not applied" through their closed reply channels.
            clawgate_telemetry::limited!(error, error = %e, writes = group.len(), "cannot begin a write transaction");
            group.clear();
            return;
        }
    };
    let now = now_ms();
    let mut completions = Vec::with_capacity(group.len());
    let mut poisoned = None;
    for job in group.drain(..) {
        if poisoned.is_some() {
            // After a storage error the rest of the group is not applied.
            continue;
        }
        let (complete, applied) = job(&txn, now);
        completions.push(complete);
        poisoned = applied.err();
    }
    let committed = match poisoned {
        Some(e) => {
            clawgate_telemetry::limited!(error, error = %e, "storage error; the write group was rolled back");
            let _ = txn.abort();
            Err(StoreError::Internal(format!(
                "the write group was rolled back: {e}"
            )))
        }
        None => txn
            .commit()
            .map_err(|e| StoreError::Unavailable(format!("commit failed: {e}"))),
    };
    for complete in completions {
        complete(committed.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Job {
        Box::new(|_, _| (Box::new(|_| ()), Ok(())))
    }

    /// Urgent writes go first in a group, however many bulk writes wait.
    #[tokio::test]
    async fn urgent_writes_lead_every_group() {
        let queue = WriteQueue::new(16);
        for _ in 0..5 {
            queue.push(Lane::Bulk, noop()).await.unwrap();
        }
        queue.push(Lane::Urgent, noop()).await.unwrap();
        let mut group = Vec::new();
        queue.next_group(3, &mut group);
        assert_eq!(group.len(), 3);
        let lanes = queue.lanes.lock().unwrap();
        assert!(lanes.urgent.is_empty(), "the urgent write was taken");
        assert_eq!(lanes.bulk.len(), 3, "two bulk writes filled the group");
    }

    /// The bound holds callers back until the writer takes writes.
    #[tokio::test]
    async fn a_full_queue_holds_callers_back() {
        let queue = std::sync::Arc::new(WriteQueue::new(2));
        queue.push(Lane::Bulk, noop()).await.unwrap();
        queue.push(Lane::Urgent, noop()).await.unwrap();
        let third = tokio::spawn({
            let queue = queue.clone();
            async move { queue.push(Lane::Urgent, noop()).await }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "no room for a third write");
        let mut group = Vec::new();
        queue.next_group(8, &mut group);
        assert_eq!(group.len(), 2);
        third.await.unwrap().unwrap();
        queue.close();
        assert!(queue.push(Lane::Bulk, noop()).await.is_err());
        group.clear();
        queue.next_group(8, &mut group);
        assert_eq!(group.len(), 1, "what was queued before the close is taken");
        group.clear();
        queue.next_group(8, &mut group);
        assert!(group.is_empty(), "then the writer stops");
    }
}

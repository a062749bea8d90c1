//! The bound on runs admitted and not yet started
//! (`COORDINATOR_MAX_QUEUED_RUNS`, `COORDINATOR_MAX_QUEUED_BYTES`).
//!
//! A queued run holds its message and attachments in memory (up to 1 MiB
//! and 4 MiB at the default limits) until it starts: without a bound, a
//! client with `operator.write` could queue runs until the coordinator runs
//! out of memory. Each run admitted takes a [`QueueCharge`] of its bytes,
//! held in its state until it leaves the queue (it starts, is decided, or
//! is dropped); a submit that would go over either bound is refused
//! `QUEUE_FULL` (RESOURCE_EXHAUSTED) before anything is written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use run_coordinator_api::error::CoordinatorError;
use run_coordinator_api::model::RunSpec;

/// What queued runs hold now, against the bounds.
#[derive(Debug)]
pub struct QueueBudget {
    max_runs: usize,
    max_bytes: usize,
    runs: AtomicUsize,
    bytes: AtomicUsize,
}

/// The bytes a run's spec holds in memory while it waits.
pub fn spec_bytes(spec: &RunSpec) -> usize {
    spec.message.len()
        + spec
            .attachments
            .iter()
            .map(|a| a.data.len() + a.mime_type.len() + a.file_name.len())
            .sum::<usize>()
        + spec.options.to_string().len()
}

impl QueueBudget {
    pub fn new(max_runs: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            max_runs,
            max_bytes,
            runs: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
        })
    }

    /// Charges a run of `bytes`, or refuses it when the queue is full.
    /// Called under the coordinator's state lock, so checks and charges do
    /// not race one another.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Result<QueueCharge, CoordinatorError> {
        let runs = self.runs.load(Ordering::Acquire);
        if runs >= self.max_runs {
            return Err(CoordinatorError::QueueFull(format!(
                "the run coordinator's queue is full: {runs} runs wait to start (at most {}, \
                 COORDINATOR_MAX_QUEUED_RUNS); retry later",
                self.max_runs
            )));
        }
        let queued = self.bytes.load(Ordering::Acquire);
        if queued.saturating_add(bytes) > self.max_bytes {
            return Err(CoordinatorError::QueueFull(format!(
                "the run coordinator's queue is full: its runs hold {queued} bytes and this one \
                 {bytes} (at most {}, COORDINATOR_MAX_QUEUED_BYTES); retry later",
                self.max_bytes
            )));
        }
        self.runs.fetch_add(1, Ordering::AcqRel);
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        Ok(QueueCharge {
            budget: self.clone(),
            bytes,
        })
    }

    /// Runs charged now.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::Acquire)
    }
}

/// One queued run's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct QueueCharge {
    budget: Arc<QueueBudget>,
    bytes: usize,
}

impl Drop for QueueCharge {
    fn drop(&mut self) {
        self.budget.runs.fetch_sub(1, Ordering::AcqRel);
        self.budget.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_bytes_are_bounded_and_given_back() {
        let budget = QueueBudget::new(2, 100);
        let a = budget.charge(60).unwrap();
        assert!(
            matches!(budget.charge(41), Err(CoordinatorError::QueueFull(m)) if m.contains("COORDINATOR_MAX_QUEUED_BYTES"))
        );
        let b = budget.charge(40).unwrap();
        assert!(
            matches!(budget.charge(0), Err(CoordinatorError::QueueFull(m)) if m.contains("COORDINATOR_MAX_QUEUED_RUNS"))
        );
        drop(a);
        assert_eq!(budget.runs(), 1);
        let _c = budget.charge(60).unwrap();
        drop(b);
        assert_eq!(budget.runs(), 1);
    }
}

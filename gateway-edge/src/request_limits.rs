//! One connection's request limits, counted where requests are dispatched:
//! how many it has in flight (`EDGE_MAX_IN_FLIGHT`) and how many calls in
//! a row were refused for its role or scopes (`EDGE_UNAUTHORIZED_FLOOD_LIMIT`,
//! the flood guard).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

#[derive(Default)]
pub struct RequestCounters {
    in_flight: AtomicUsize,
    unauthorized_in_a_row: AtomicU32,
}

impl RequestCounters {
    /// Counts a request in when fewer than `max` are in flight; it is
    /// counted out when the [`InFlight`] of [`Self::started`] drops.
    pub fn admit(&self, max: usize) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The admitted request's handler runs: counted out when it drops,
    /// answered or not (a panicking handler too).
    pub fn started(&self) -> InFlight<'_> {
        InFlight(&self.in_flight)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Notes a call refused for the connection's role or scopes; the
    /// refusals in a row.
    pub fn unauthorized(&self) -> u32 {
        self.unauthorized_in_a_row.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Any other answer ends a row of refusals.
    pub fn answered(&self) {
        if self.unauthorized_in_a_row.load(Ordering::Relaxed) != 0 {
            self.unauthorized_in_a_row.store(0, Ordering::Relaxed);
        }
    }
}

/// An admitted request whose handler has not finished.
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_counts_out_on_drop() {
        let counters = RequestCounters::default();
        assert!(counters.admit(2));
        let first = counters.started();
        assert!(counters.admit(2));
        let second = counters.started();
        assert!(!counters.admit(2), "a third is over the limit");
        assert_eq!(counters.in_flight(), 2, "the refused one is not counted");
        drop(first);
        assert!(counters.admit(2), "room again once one finished");
        drop((second, counters.started()));
        assert_eq!(counters.in_flight(), 0);
    }

    #[test]
    fn unauthorized_in_a_row_count_in_a_row() {
        let counters = RequestCounters::default();
        assert_eq!(counters.unauthorized(), 1);
        assert_eq!(counters.unauthorized(), 2);
        counters.answered();
        assert_eq!(counters.unauthorized(), 1);
    }
}

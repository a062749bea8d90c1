//! How a serving coordinator stops, with every step on a deadline.
//!
//! A planned stop (SIGTERM) drains for up to the drain timeout and hands
//! its partitions over. A stop after the tenure ended (the leases expired
//! by its own clock, a renewal or a write was refused) must be quick
//! whatever the store, the network or its own open calls do: until the
//! process is gone its pod is not restarted and cannot rejoin. So the
//! stop after a loss is over within [`LossDeadlines::calls`] (13/8 of the
//! lease TTL from the loss), and a process that is the coordinator's (its
//! binary, the all-in-one) adds a watchdog thread that ends the process at
//! [`LossDeadlines::process`] (7/4 TTL) should anything still hold it, so
//! that it is gone within 2 × TTL.

use std::time::Duration;

use tokio::time::Instant;

/// The exit status of a coordinator process that its watchdog ended
/// (`EX_TEMPFAIL`: a restart is the remedy).
pub const WATCHDOG_EXIT_CODE: i32 = 75;

/// What a planned stop may add to the drain timeout for the handover
/// (releasing the leases) and for open calls to end.
pub const PLANNED_STOP_GRACE: Duration = Duration::from_secs(5);

/// The deadlines of the stop after a lost tenure, counted from the loss.
#[derive(Debug, Clone, Copy)]
pub struct LossDeadlines {
    /// Executing runs are aborted; their executors have until then to
    /// record what they can (nothing of a lost partition lands).
    pub abort: Instant,
    /// The store's verdict on the partitions held (and the release of any
    /// still held) is asked until then; a partitioned coordinator hears it
    /// if its link heals by then.
    pub verdict: Instant,
    /// Open calls (subscriptions, waits) have until then to end; the
    /// server stops without them after.
    pub calls: Instant,
    /// The watchdog ends the process then, if it still runs.
    pub process: Instant,
}

impl LossDeadlines {
    pub fn new(lost_at: Instant, lease_ttl: Duration) -> Self {
        Self {
            abort: lost_at + lease_ttl / 4,
            verdict: lost_at + lease_ttl * 3 / 2,
            calls: lost_at + lease_ttl * 13 / 8,
            process: lost_at + lease_ttl * 7 / 4,
        }
    }

    /// Starts a thread, outside the async runtime (so no stuck task or
    /// blocked worker can hold it up), that ends the process with
    /// [`WATCHDOG_EXIT_CODE`] at [`process`](Self::process). Only for a
    /// process whose end is the remedy (the coordinator's binary, the
    /// all-in-one), never a test's.
    pub fn start_watchdog(&self, reason: String) {
        let left = self.process.saturating_duration_since(Instant::now());
        let started = std::thread::Builder::new()
            .name("loss-watchdog".into())
            .spawn(move || {
                std::thread::sleep(left);
                // Plain stderr: the logging pipeline may be what is stuck.
                eprintln!(
                    "run coordinator: still running {left:?} after its tenure ended ({reason}); \
                     exiting with status {WATCHDOG_EXIT_CODE}"
                );
                std::process::exit(WATCHDOG_EXIT_CODE);
            });
        if let Err(err) = started {
            tracing::error!(error = %err, "cannot start the loss watchdog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_deadline_is_in_order_and_within_twice_the_ttl() {
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        let d = LossDeadlines::new(now, ttl);
        assert!(now < d.abort && d.abort < d.verdict && d.verdict < d.calls);
        assert!(d.calls < d.process && d.process < now + 2 * ttl);
        // A coordinator cut off from the store fences itself before its
        // leases expire; a link that heals up to half a TTL after they
        // expired still brings the verdict.
        assert!(d.verdict >= now + ttl * 3 / 2);
    }
}

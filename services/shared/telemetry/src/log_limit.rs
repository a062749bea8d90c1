//! Rate-limited log lines: at most one line per interval from one call
//! site, carrying how many were suppressed since the last one.
//!
//! A log line a client can cause (a failed accept, a store error while
//! serving its request, a run of its that fails) must not be written once
//! per request or per connection: a client that repeats the cause would
//! turn the log into a flood that fills a pod's disk (1.7 million lines in
//! 40 s were seen from an accept loop out of file descriptors). Every such
//! `warn!` or `error!` goes through [`limited!`](crate::limited), which keeps
//! a [`LogLimit`] per call site:
//!
//! ```
//! # let err = "boom";
//! clawgate_telemetry::limited!(warn, error = %err, "accept failed");
//! ```
//!
//! writes `accept failed error=boom suppressed=0` at once, and for the rest
//! of that second counts repeats instead of writing them; the next line
//! written says how many were left out (`suppressed=…`). The limiter is a
//! lock-free pair of atomics, so a suppressed line costs two atomic
//! operations and a clock read.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often one call site of [`limited!`](crate::limited) may write.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The state of one rate-limited call site.
pub struct LogLimit {
    interval_ns: u64,
    /// When the next line may be written, ns since [`origin`]; 0: now.
    next_at: AtomicU64,
    /// Lines left out since the last one written.
    suppressed: AtomicU64,
}

/// The process's clock origin for the limiters (a `const` constructor
/// cannot hold an `Instant`).
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl LogLimit {
    /// At most a line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval_ns: interval.as_nanos() as u64,
            next_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// At most a line per [`LOG_INTERVAL`].
    pub const fn per_second() -> Self {
        Self::new(LOG_INTERVAL)
    }

    /// Whether a line may be written now: `Some(lines suppressed since the
    /// last one)`, or `None` (this one is counted as suppressed).
    pub fn check(&self) -> Option<u64> {
        self.check_at(origin().elapsed().as_nanos() as u64 + 1)
    }

    /// [`check`](Self::check) at `now` (ns since an origin, above 0).
    pub fn check_at(&self, now: u64) -> Option<u64> {
        let next_at = self.next_at.load(Ordering::Acquire);
        let due = now >= next_at
            && self
                .next_at
                .compare_exchange(
                    next_at,
                    now + self.interval_ns,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if due {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

/// A `tracing` event at `$level` (`warn`, `error`, …), written at most once
/// a second from this call site, with a `suppressed` field counting the
/// ones left out before it (see the module's comment). Takes what the
/// `tracing` macro takes after the level.
#[macro_export]
macro_rules! limited {
    ($level:ident, $($rest:tt)+) => {{
        static LIMIT: $crate::log_limit::LogLimit = $crate::log_limit::LogLimit::per_second();
        if let ::std::option::Option::Some(suppressed) = LIMIT.check() {
            ::tracing::$level!(suppressed, $($rest)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_rest() {
        let limit = LogLimit::per_second();
        assert_eq!(limit.check_at(1), Some(0), "the first is written");
        for n in 1..=1000 {
            assert_eq!(limit.check_at(1 + n * 100), None, "within the second");
        }
        assert_eq!(limit.check_at(SECOND), None);
        assert_eq!(
            limit.check_at(SECOND + 1),
            Some(1001),
            "the next second's first line says how many were left out"
        );
        assert_eq!(limit.check_at(SECOND + 2), None);
        assert_eq!(limit.check_at(10 * SECOND), Some(1));
        assert_eq!(limit.check_at(12 * SECOND), Some(0));
    }

    #[test]
    fn racing_threads_write_one_line_per_interval() {
        let limit = std::sync::Arc::new(LogLimit::per_second());
        let written: u64 = (0..4)
            .map(|_| {
                let limit = limit.clone();
                std::thread::spawn(move || {
                    (0..10_000u64)
                        .filter(|n| limit.check_at(1 + n % 3).is_some())
                        .count() as u64
                })
            })
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(written, 1, "one line in the first interval, of 40,000");
        assert_eq!(limit.check_at(SECOND + 5), Some(39_999));
    }

    #[test]
    fn the_macro_limits_each_call_site() {
        let mut written = 0;
        for _ in 0..100 {
            // The `if` guards what the macro writes: count the lines that
            // would be.
            static LIMIT: LogLimit = LogLimit::per_second();
            if LIMIT.check().is_some() {
                written += 1;
            }
            crate::limited!(warn, n = written, "a repeated line");
        }
        assert_eq!(written, 1);
    }
}

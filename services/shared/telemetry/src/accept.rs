//! What a listener does when `accept` fails: it backs off and logs at most
//! a line a second.
//!
//! An accept that fails because the process is out of file descriptors
//! (`EMFILE`) or the system is out of memory fails again at once: retried
//! in a loop it burns a core and, logged each time, writes gigabytes of the
//! same line. As Go's `net/http` and tokio's mini-redis do, the loop sleeps
//! after a failure, 5 ms and doubling up to 1 s, and the first success
//! resets the pause. The line goes through [`limited!`](crate::limited).

use std::time::Duration;

/// The pause after a failed accept, doubling per failure in a row.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    pause: Duration,
}

impl AcceptBackoff {
    pub const FIRST: Duration = Duration::from_millis(5);
    pub const LONGEST: Duration = Duration::from_secs(1);

    /// An accept succeeded: the next failure starts over.
    pub fn accepted(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// An accept failed with `error`: logs it (rate-limited, as `listener`)
    /// and returns how long to sleep before accepting again.
    pub fn failed(&mut self, listener: &str, error: &std::io::Error) -> Duration {
        self.pause = (self.pause * 2).clamp(Self::FIRST, Self::LONGEST);
        crate::limited!(
            warn,
            listener,
            %error,
            retry_in_ms = self.pause.as_millis() as u64,
            "accept failed; backing off"
        );
        self.pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_to_a_second_and_a_success_resets_it() {
        let mut backoff = AcceptBackoff::default();
        let error = std::io::Error::from_raw_os_error(24);
        let pauses: Vec<u64> = (0..10)
            .map(|_| backoff.failed("test", &error).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.accepted();
        assert_eq!(backoff.failed("test", &error), AcceptBackoff::FIRST);
    }
}

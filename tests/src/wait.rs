//! Waiting for a condition: the one poll loop of every test. A test states
//! what it waits for and how long that may take at most; the condition is
//! checked at once, then again after short pauses that grow (1 ms doubling
//! to 50 ms), so a fast machine sees the condition almost as soon as it
//! holds and a slow one is not flooded with checks. A deadline is a bound
//! on a broken system, never a measurement: pass a generous one.
//!
//! The check answers with a [`Probe`]: `bool`, `Option<T>` (`Some` is done,
//! with the value) or `Result<T, E>` (`Err` is "not yet", and the last one
//! is in the failure message: say there what was seen instead). Time is
//! tokio's, so a test on paused time waits in virtual time.

use std::fmt::{self, Display};
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The first pause between two checks; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between two checks.
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// What a check answers: done (with a value), or not yet (maybe saying
/// what it saw instead).
pub trait Probe {
    type Value;
    fn done(self) -> Result<Self::Value, Option<String>>;
}

impl Probe for bool {
    type Value = ();
    fn done(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Probe for Option<T> {
    type Value = T;
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Probe for Result<T, E> {
    type Value = T;
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

/// A wait that ran out of time: what was awaited, how long the wait took,
/// and what the last check saw instead.
#[derive(Debug, Clone)]
pub struct TimedOut {
    pub what: String,
    pub waited: Duration,
    pub last_seen: Option<String>,
}

impl Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "waited {:?} for {}", self.waited, self.what)?;
        match &self.last_seen {
            Some(seen) => write!(f, "; last seen: {seen}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for TimedOut {}

/// A wait in progress: its deadline and the pause before the next check.
/// [`poll`] and the others drive one; a loop drives one itself where its
/// check cannot be a closure handed over (in a spawned task, the future of
/// an async closure that borrows is not provably `Send`: a limit of the
/// compiler).
pub struct Pacer {
    what: String,
    started: Instant,
    deadline: Instant,
    pause: Duration,
    longest: Duration,
}

impl Pacer {
    /// A wait for `what`, for `within` at most, starting now.
    pub fn new(what: impl Display, within: Duration) -> Self {
        let started = Instant::now();
        Self {
            what: what.to_string(),
            started,
            deadline: started + within,
            pause: FIRST_PAUSE,
            longest: LONGEST_PAUSE,
        }
    }

    /// A wait that pauses `every` between checks, no longer: for a loop
    /// that samples something on each check (a high-water mark, say) and
    /// would miss a short peak between sparse checks.
    pub fn steady(what: impl Display, within: Duration, every: Duration) -> Self {
        Self {
            pause: every,
            longest: every,
            ..Self::new(what, within)
        }
    }

    /// After a check that was not done (`last_seen`: what it saw instead):
    /// the pause before the next, or how the wait timed out.
    pub async fn pause(&mut self, last_seen: Option<String>) -> Result<(), TimedOut> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(TimedOut {
                what: self.what.clone(),
                waited: now - self.started,
                last_seen,
            });
        }
        tokio::time::sleep(self.pause.min(self.deadline - now)).await;
        self.pause = (self.pause * 2).min(self.longest);
        Ok(())
    }
}

/// Checks `check` until it is done or `within` has passed; the value it
/// answered, or how the wait timed out (for a caller that adds to the
/// message, e.g. the processes' logs, or that goes on either way).
pub async fn poll<P: Probe>(
    what: impl Display,
    within: Duration,
    mut check: impl AsyncFnMut() -> P,
) -> Result<P::Value, TimedOut> {
    let mut pacer = Pacer::new(what, within);
    loop {
        match check().await.done() {
            Ok(value) => return Ok(value),
            Err(last_seen) => pacer.pause(last_seen).await?,
        }
    }
}

/// Checks the async `check` until it is done, and returns its value;
/// panics after `within`, saying what was awaited, for how long, and what
/// the last check saw.
#[track_caller]
pub fn wait_for<P: Probe>(
    what: impl Display,
    within: Duration,
    check: impl AsyncFnMut() -> P,
) -> impl Future<Output = P::Value> {
    let caller = std::panic::Location::caller();
    async move {
        poll(what, within, check)
            .await
            .unwrap_or_else(|timed_out| panic!("{timed_out} (at {caller})"))
    }
}

/// [`wait_for`] with a check that needs no awaiting.
#[track_caller]
pub fn wait_until<P: Probe>(
    what: impl Display,
    within: Duration,
    mut check: impl FnMut() -> P,
) -> impl Future<Output = P::Value> {
    wait_for(what, within, async move || check())
}

/// Waits until each of the counts `counts` reports has grown by `more`
/// since the call (every client finished `more` runs, say); panics after
/// `within` with the counts and `context()` (the processes' logs, say).
pub async fn until_each_grows(
    what: impl Display,
    counts: impl Fn() -> Vec<usize>,
    more: usize,
    within: Duration,
    context: impl Fn() -> String,
) {
    let start = counts();
    let grown = poll(what, within, async || {
        let now = counts();
        if now.iter().zip(&start).all(|(n, s)| *n >= s + more) {
            Ok(())
        } else {
            Err(format!("{now:?}, from {start:?}"))
        }
    })
    .await;
    if let Err(timed_out) = grown {
        panic!("{timed_out}:\n{}", context());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_the_check_is_done() {
        let mut checks = 0;
        let found = wait_until("the third check", Duration::from_secs(1), || {
            checks += 1;
            (checks == 3).then_some(checks * 10)
        })
        .await;
        assert_eq!(found, 30);
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_grow_up_to_the_longest() {
        let started = Instant::now();
        let mut checks = 0;
        wait_until("ten checks", Duration::from_secs(10), || {
            checks += 1;
            checks == 10
        })
        .await;
        // 1 + 2 + 4 + 8 + 16 + 32 + 50 + 50 + 50 ms between the ten checks.
        assert_eq!(started.elapsed(), Duration::from_millis(213));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_says_what_was_awaited_how_long_and_what_was_seen() {
        let mut n = 0;
        let timed_out = poll("the answer", Duration::from_millis(500), async || {
            n += 1;
            Err::<(), _>(format!("{n} checks"))
        })
        .await
        .unwrap_err();
        assert_eq!(timed_out.what, "the answer");
        assert_eq!(timed_out.waited, Duration::from_millis(500));
        let message = timed_out.to_string();
        assert!(
            message.starts_with("waited 500ms for the answer; last seen: "),
            "{message}"
        );
        assert!(message.ends_with(&format!("{n} checks")), "{message}");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waited 100ms for nothing")]
    async fn wait_until_panics_at_the_deadline() {
        wait_until("nothing", Duration::from_millis(100), || false).await;
    }
}

//! How far a scenario got: the stage it is in, and the samples taken so
//! far. A scenario cut off by its deadline (`--scenario-timeout`) still
//! reports a row, from these.

use std::sync::Mutex;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::stats::Stats;

/// Shared by a scenario's tasks; read when the scenario ends or is cut off.
#[derive(Debug, Default)]
pub struct Progress {
    stage: Mutex<Stage>,
    samples: Mutex<Samples>,
}

#[derive(Debug, Default)]
struct Stage {
    what: &'static str,
    done: usize,
    of: usize,
}

/// The samples of a looping scenario: its own, and for `run` its ACKs.
#[derive(Debug, Default)]
struct Samples {
    main: Vec<Duration>,
    acks: Vec<Duration>,
    /// When the load started, and when the last sample was taken.
    started: Option<Instant>,
    last: Option<Instant>,
}

impl Progress {
    /// A new stage: `what` (e.g. "connections opened"), none of `of` done.
    pub fn stage(&self, what: &'static str, of: usize) {
        *self.stage.lock().unwrap() = Stage { what, done: 0, of };
    }

    /// One more of the stage done.
    pub fn advance(&self) {
        self.stage.lock().unwrap().done += 1;
    }

    /// "412 of 1280 requests answered", or "" before the first stage.
    pub fn describe(&self) -> String {
        let stage = self.stage.lock().unwrap();
        if stage.what.is_empty() {
            return String::new();
        }
        format!("{} of {} {}", stage.done, stage.of, stage.what)
    }

    /// The load starts now: the rate is over the time from here to the
    /// last sample.
    pub fn start_load(&self) {
        self.samples.lock().unwrap().started = Some(Instant::now());
    }

    /// The load ended now (when that is later than the last sample).
    pub fn end_load(&self) {
        let now = Instant::now();
        let mut samples = self.samples.lock().unwrap();
        samples.last = Some(samples.last.map_or(now, |last| last.max(now)));
    }

    /// A counted sample (and its ACK, for `run`), taken `took` after
    /// `sent`.
    pub fn sample(&self, sent: Instant, took: Duration, ack: Option<Duration>) {
        let mut samples = self.samples.lock().unwrap();
        samples.main.push(took);
        samples.acks.extend(ack);
        let end = sent + took;
        samples.last = Some(samples.last.map_or(end, |last| last.max(end)));
    }

    /// The figures of the samples so far: the scenario's and its ACKs'.
    pub fn stats(&self) -> (Stats, Stats) {
        let samples = self.samples.lock().unwrap();
        let wall = match (samples.started, samples.last) {
            (Some(started), Some(last)) => last.saturating_duration_since(started),
            _ => Duration::ZERO,
        };
        (
            Stats::of(samples.main.clone(), wall),
            Stats::of(samples.acks.clone(), wall),
        )
    }
}

/// Spawned tasks that are aborted when this is dropped: a scenario cut off
/// by its deadline leaves no connection behind for the next one to meet.
#[derive(Debug)]
pub struct Tasks<T>(Vec<JoinHandle<T>>);

impl<T> Default for Tasks<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Send + 'static> Tasks<T> {
    pub fn spawn(&mut self, task: impl Future<Output = T> + Send + 'static) {
        self.0.push(tokio::spawn(task));
    }

    /// Each task's output, in the order they were spawned.
    pub async fn join(mut self) -> Result<Vec<T>, tokio::task::JoinError> {
        let mut outputs = Vec::with_capacity(self.0.len());
        for handle in &mut self.0 {
            outputs.push(handle.await?);
        }
        Ok(outputs)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> Drop for Tasks<T> {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_says_how_far_it_got() {
        let progress = Progress::default();
        assert_eq!(progress.describe(), "");
        progress.stage("requests answered", 8);
        progress.advance();
        progress.advance();
        assert_eq!(progress.describe(), "2 of 8 requests answered");
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_is_over_the_time_to_the_last_sample() {
        let progress = Progress::default();
        progress.start_load();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        progress.sample(sent, Duration::from_secs(1), Some(Duration::from_millis(5)));
        progress.sample(sent, Duration::from_secs(2), None);
        let (main, acks) = progress.stats();
        assert_eq!(main.count, 2);
        assert_eq!(main.rate, 1.0);
        assert_eq!(acks.count, 1);
    }

    #[tokio::test]
    async fn dropped_tasks_are_aborted() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut tasks = Tasks::default();
        tasks.spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        });
        drop(tasks);
        // The task's end drops the sender: the receiver hears it.
        assert!(rx.await.is_err());
    }
}

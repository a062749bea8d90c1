//! Percentiles and rates of a scenario's samples.

use std::time::Duration;

/// Latency percentiles of a scenario's samples and its rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Samples per second over the scenario's wall time.
    pub rate: f64,
}

impl Stats {
    /// The nearest-rank percentiles of `samples`, taken over `wall`.
    pub fn of(mut samples: Vec<Duration>, wall: Duration) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            samples
                .get(((samples.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        Self {
            count: samples.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or_default(),
            rate: samples.len() as f64 / wall.as_secs_f64().max(f64::EPSILON),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_of_the_sorted_samples() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let stats = Stats::of(samples, Duration::from_secs(2));
        assert_eq!(stats.p50, Duration::from_millis(50));
        assert_eq!(stats.p90, Duration::from_millis(90));
        assert_eq!(stats.p99, Duration::from_millis(99));
        assert_eq!(stats.max, Duration::from_millis(100));
        assert_eq!(stats.count, 100);
        assert!((stats.rate - 50.0).abs() < 1e-9);
    }

    #[test]
    fn no_samples_are_zeros() {
        let stats = Stats::of(Vec::new(), Duration::from_secs(1));
        assert_eq!(stats.count, 0);
        assert_eq!(stats.max, Duration::ZERO);
    }
}

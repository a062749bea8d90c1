//! The coordinator's metrics, registered under `clawgate_coordinator`.
//! Documented in docs/metrics.md.

use std::fmt;
use std::time::Instant;

use clawgate_telemetry::metrics::latency_histogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use run_coordinator_api::error::CoordinatorResult;
use run_coordinator_api::model::{Admission, RunStatus, Submitted};

type AdmissionLabels = [(&'static str, &'static str); 2];
type StatusLabels = [(&'static str, &'static str); 1];

/// Runs waiting and executing right now (read at scrape time, so the
/// gauges are exact and the run paths pay nothing for them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    /// Admitted runs waiting for their session lane or the global cap.
    pub queued: usize,
    pub executing: usize,
    /// Partitions this instance owns now.
    pub partitions_held: usize,
}

#[derive(Debug)]
pub(crate) struct CoordinatorMetrics {
    admissions: Family<AdmissionLabels, Counter>,
    runs_finished: Family<StatusLabels, Counter>,
    ack_latency: Histogram,
    takeover: Histogram,
    partition_moves: Family<DirectionLabels, Counter>,
}

type DirectionLabels = [(&'static str, &'static str); 1];

/// `(outcome, reason)` of a Submit that was answered with a run.
fn admission_labels(admission: Admission) -> AdmissionLabels {
    let (outcome, reason) = match admission {
        Admission::Accepted => ("accepted", "new"),
        Admission::InFlight => ("deduplicated", "in_flight"),
        Admission::Completed => ("deduplicated", "completed"),
    };
    [("outcome", outcome), ("reason", reason)]
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        let metrics = Self {
            admissions: Family::default(),
            runs_finished: Family::default(),
            ack_latency: latency_histogram(),
            takeover: latency_histogram(),
            partition_moves: Family::default(),
        };
        for direction in ["acquired", "handed_off"] {
            metrics
                .partition_moves
                .get_or_create_owned(&[("direction", direction)]);
        }
        // The usual series exist from the start, at zero, so that rates
        // over them are defined before the first event.
        for admission in [
            Admission::Accepted,
            Admission::InFlight,
            Admission::Completed,
        ] {
            metrics
                .admissions
                .get_or_create_owned(&admission_labels(admission));
        }
        for status in RunStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            metrics
                .runs_finished
                .get_or_create_owned(&[("status", status.as_str())]);
        }
        metrics
    }
}

impl CoordinatorMetrics {
    /// Registers the metrics under `clawgate_coordinator`; `load` is asked
    /// at every scrape (`None`: the coordinator is gone, no gauges).
    pub fn register(
        &self,
        registry: &mut Registry,
        load: impl Fn() -> Option<Load> + Send + Sync + 'static,
    ) {
        let registry = registry.sub_registry_with_prefix("clawgate_coordinator");
        registry.register(
            "admissions",
            "Submit answers by outcome (accepted, deduplicated, rejected) and reason",
            self.admissions.clone(),
        );
        registry.register(
            "runs_finished",
            "Runs that reached a terminal status, by status",
            self.runs_finished.clone(),
        );
        registry.register(
            "ack_duration_seconds",
            "Time from a Submit's arrival to its accepted answer (new runs only)",
            self.ack_latency.clone(),
        );
        registry.register(
            "takeover_duration_seconds",
            "Time from being granted partitions to serving them (recovery of the earlier owner's runs included)",
            self.takeover.clone(),
        );
        registry.register(
            "partition_moves",
            "Partitions this coordinator took (acquired) or gave to another by a graceful handoff (handed_off)",
            self.partition_moves.clone(),
        );
        registry.register_collector(Box::new(LoadCollector(load)));
    }

    /// Counts partitions taken (`acquired`) or handed off (`handed_off`).
    pub fn partitions_moved(&self, direction: &'static str, count: usize) {
        self.partition_moves
            .get_or_create(&[("direction", direction)])
            .inc_by(count as u64);
    }

    /// Counts one Submit answer; an accepted one also times its ACK.
    pub fn submitted(&self, result: &CoordinatorResult<Submitted>, arrived: Instant) {
        let labels = match result {
            Ok(submitted) => {
                if submitted.admission == Admission::Accepted {
                    self.ack_latency.observe(arrived.elapsed().as_secs_f64());
                }
                admission_labels(submitted.admission)
            }
            Err(err) => [("outcome", "rejected"), ("reason", err.code())],
        };
        self.admissions.get_or_create(&labels).inc();
    }

    pub fn took_leases(&self, took: std::time::Duration) {
        self.takeover.observe(took.as_secs_f64());
    }

    pub fn run_finished(&self, status: RunStatus) {
        self.runs_finished
            .get_or_create(&[("status", status.as_str())])
            .inc();
    }
}

struct LoadCollector<F>(F);

impl<F> fmt::Debug for LoadCollector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LoadCollector")
    }
}

impl<F> Collector for LoadCollector<F>
where
    F: Fn() -> Option<Load> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(load) = (self.0)() else {
            return Ok(());
        };
        // Unlike `Registry::register`, a collector's help gets no final period added.
        let gauges = [
            (
                "runs_queued",
                "Admitted runs waiting for their session lane or the global cap.",
                load.queued,
            ),
            ("runs_executing", "Runs executing now.", load.executing),
            (
                "partitions_held",
                "Partitions this coordinator owns now.",
                load.partitions_held,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value as i64);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

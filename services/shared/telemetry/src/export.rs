//! Span export that can never slow a request down.
//!
//! Finished spans go into a bounded queue (`try_send`, never waits); one
//! tokio task drains it in batches to the exporter, each export under a
//! timeout. A full queue drops the span and counts it; a failed export
//! counts the spans it carried and logs at most once a minute. After a
//! failure the exporter rests (1 s, doubling up to 30 s) and batches due in
//! the meantime are dropped and counted without being encoded, so a dead
//! collector costs little more than a counter increment per span.

use std::fmt;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// Queue and batch sizes, read from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// `OTEL_BSP_MAX_QUEUE_SIZE`: spans waiting for export; more are dropped.
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans per export call.
    pub max_batch: usize,
    /// `OTEL_BSP_SCHEDULE_DELAY` (ms): the longest a span waits for its batch.
    pub delay: Duration,
    /// `OTEL_BSP_EXPORT_TIMEOUT` (ms): the longest one export may take.
    pub export_timeout: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_millis(5000),
            export_timeout: Duration::from_millis(30_000),
        }
    }
}

impl QueueSettings {
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Unparsable or zero values keep their defaults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let number = |name: &str| {
            lookup(name)
                .and_then(|raw| raw.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let defaults = Self::default();
        let max_queue =
            number("OTEL_BSP_MAX_QUEUE_SIZE").map_or(defaults.max_queue, |n| n as usize);
        let max_batch = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
            .map_or(defaults.max_batch, |n| n as usize)
            .min(max_queue);
        Self {
            max_queue,
            max_batch,
            delay: number("OTEL_BSP_SCHEDULE_DELAY").map_or(defaults.delay, Duration::from_millis),
            export_timeout: number("OTEL_BSP_EXPORT_TIMEOUT")
                .map_or(defaults.export_timeout, Duration::from_millis),
        }
    }
}

/// What happened to finished spans, process-wide (one exporter per process).
#[derive(Debug, Clone, Default)]
pub struct ExportCounters {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

impl ExportCounters {
    /// The counters every process has, whether or not it exports.
    pub fn global() -> &'static ExportCounters {
        static COUNTERS: std::sync::OnceLock<ExportCounters> = std::sync::OnceLock::new();
        COUNTERS.get_or_init(ExportCounters::default)
    }

    /// Adds the counters to a service's registry (`clawgate_trace_spans_*`).
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("clawgate_trace");
        sub.register(
            "spans_exported",
            "Finished spans the OTLP collector accepted",
            self.exported.clone(),
        );
        sub.register(
            "spans_dropped",
            "Finished spans dropped because the export queue was full",
            self.dropped.clone(),
        );
        sub.register(
            "spans_failed",
            "Finished spans lost to a failed or timed-out export",
            self.failed.clone(),
        );
    }
}

/// Spans waiting for export, shared by the processor and the export task.
struct Queue {
    spans: Mutex<Vec<SpanData>>,
    /// Callers of [`FlushHandle::flush`] waiting for the next export.
    flushes: Mutex<Vec<oneshot::Sender<()>>>,
    /// Wakes the export task: a batch is full, a flush is asked for, or
    /// the processor shut down.
    wake: Notify,
    closed: AtomicBool,
    settings: QueueSettings,
}

impl Queue {
    fn take(&self) -> Vec<SpanData> {
        std::mem::take(&mut *self.spans.lock().unwrap())
    }
}

/// The span processor: a bounded queue in front of one export task. Ending
/// a span takes a short lock and wakes nobody until a batch is full; the
/// export task otherwise runs once per `OTEL_BSP_SCHEDULE_DELAY`. (Waking
/// it per span costs a thread wake-up per span, which on a busy machine is
/// most of what tracing costs.)
pub struct QueueProcessor {
    queue: Arc<Queue>,
    counters: ExportCounters,
}

impl fmt::Debug for QueueProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueProcessor").finish_non_exhaustive()
    }
}

/// Flushes a [`QueueProcessor`] from async code.
#[derive(Clone)]
pub struct FlushHandle {
    queue: Arc<Queue>,
}

impl FlushHandle {
    /// Exports everything queued before this call; gives up after `limit`.
    pub async fn flush(&self, limit: Duration) {
        let (done, exported) = oneshot::channel();
        self.queue.flushes.lock().unwrap().push(done);
        self.queue.wake.notify_one();
        let _ = tokio::time::timeout(limit, exported).await;
    }
}

impl QueueProcessor {
    /// Spawns the export task on the current tokio runtime. The exporter
    /// must already carry its resource.
    pub fn spawn<E: SpanExporter + 'static>(
        exporter: E,
        settings: QueueSettings,
        counters: ExportCounters,
    ) -> (Self, FlushHandle) {
        let queue = Arc::new(Queue {
            spans: Mutex::new(Vec::with_capacity(settings.max_batch)),
            flushes: Mutex::new(Vec::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            settings,
        });
        tokio::spawn(drain(exporter, queue.clone(), counters.clone()));
        let flush = FlushHandle {
            queue: queue.clone(),
        };
        (Self { queue, counters }, flush)
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let settings = &self.queue.settings;
        let queued = {
            let mut spans = self.queue.spans.lock().unwrap();
            if spans.len() >= settings.max_queue || self.queue.closed.load(Ordering::Relaxed) {
                None
            } else {
                spans.push(span);
                Some(spans.len())
            }
        };
        match queued {
            None => {
                self.counters.dropped.inc();
            }
            Some(len) if len == settings.max_batch => self.queue.wake.notify_one(),
            Some(_) => {}
        }
    }

    /// Synchronous flushing would block a runtime thread on the export task;
    /// async callers use [`FlushHandle::flush`] instead.
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if self.queue.closed.swap(true, Ordering::Relaxed) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        self.queue.wake.notify_one();
        Ok(())
    }
}

async fn drain<E: SpanExporter>(exporter: E, queue: Arc<Queue>, counters: ExportCounters) {
    let settings = &queue.settings;
    let mut failures = Failures::default();
    let mut ticks = tokio::time::interval(settings.delay);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = queue.wake.notified() => {}
            _ = ticks.tick() => {}
        }
        // Flushes asked for before the spans are taken see them exported.
        let flushes = std::mem::take(&mut *queue.flushes.lock().unwrap());
        let mut spans = queue.take();
        while !spans.is_empty() {
            let rest = spans.split_off(spans.len().min(settings.max_batch));
            export(&exporter, spans, settings, &counters, &mut failures).await;
            spans = rest;
        }
        for done in flushes {
            let _ = done.send(());
        }
        if queue.closed.load(Ordering::Relaxed) {
            let _ = exporter.shutdown();
            return;
        }
    }
}

async fn export<E: SpanExporter>(
    exporter: &E,
    spans: Vec<SpanData>,
    settings: &QueueSettings,
    counters: &ExportCounters,
    failures: &mut Failures,
) {
    let count = spans.len() as u64;
    if failures.resting() {
        counters.failed.inc_by(count);
        return;
    }
    let error = match tokio::time::timeout(settings.export_timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {
            counters.exported.inc_by(count);
            failures.recovered();
            return;
        }
        Ok(Err(error)) => error.to_string(),
        Err(_) => format!("no answer within {:?}", settings.export_timeout),
    };
    counters.failed.inc_by(count);
    failures.record(&error);
}

/// Failed exports: when to try again, and saying so at most once a minute.
#[derive(Default)]
struct Failures {
    rest_until: Option<Instant>,
    rest: Duration,
    last_log: Option<Instant>,
    since_log: u64,
}

impl Failures {
    const LOG_EVERY: Duration = Duration::from_secs(60);
    const FIRST_REST: Duration = Duration::from_secs(1);
    const LONGEST_REST: Duration = Duration::from_secs(30);

    fn resting(&self) -> bool {
        self.rest_until.is_some_and(|until| Instant::now() < until)
    }

    fn recovered(&mut self) {
        self.rest = Duration::ZERO;
        self.rest_until = None;
    }

    fn record(&mut self, error: &str) {
        self.rest = (self.rest * 2).clamp(Self::FIRST_REST, Self::LONGEST_REST);
        self.rest_until = Some(Instant::now() + self.rest);
        self.since_log += 1;
        if self
            .last_log
            .is_some_and(|at| at.elapsed() < Self::LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            target: "clawgate_telemetry::export",
            failed_exports = self.since_log,
            retry_in = ?self.rest,
            %error,
            "exporting spans to the OTLP collector fails; spans are being dropped"
        );
        self.last_log = Some(Instant::now());
        self.since_log = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceFlags, TraceState};
    use opentelemetry::{SpanId, TraceId};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    #[derive(Debug, Default, Clone)]
    struct Collecting {
        batches: Arc<Mutex<Vec<usize>>>,
        fail: bool,
    }

    impl SpanExporter for Collecting {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.batches.lock().unwrap().push(batch.len());
            if self.fail {
                Err(OTelSdkError::InternalFailure("collector down".into()))
            } else {
                Ok(())
            }
        }
    }

    fn span(n: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(n) + 1),
                SpanId::from(n + 1),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "test".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    fn settings(max_queue: usize, max_batch: usize) -> QueueSettings {
        QueueSettings {
            max_queue,
            max_batch,
            delay: Duration::from_secs(3600),
            export_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn settings_come_from_the_standard_variables() {
        let env = |name: &str| match name {
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100".to_owned()),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("500".to_owned()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("250".to_owned()),
            "OTEL_BSP_EXPORT_TIMEOUT" => Some("nonsense".to_owned()),
            _ => None,
        };
        let settings = QueueSettings::from_lookup(env);
        assert_eq!(settings.max_queue, 100);
        assert_eq!(settings.max_batch, 100, "a batch never exceeds the queue");
        assert_eq!(settings.delay, Duration::from_millis(250));
        assert_eq!(settings.export_timeout, Duration::from_secs(30));
    }

    #[tokio::test]
    async fn full_batches_export_and_a_flush_sends_the_rest() {
        let exporter = Collecting::default();
        let counters = ExportCounters::default();
        let (processor, flush) =
            QueueProcessor::spawn(exporter.clone(), settings(100, 4), counters.clone());
        for n in 0..10 {
            processor.on_end(span(n));
        }
        flush.flush(Duration::from_secs(5)).await;
        assert_eq!(*exporter.batches.lock().unwrap(), vec![4, 4, 2]);
        assert_eq!(counters.exported.get(), 10);
        assert_eq!(counters.dropped.get(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let exporter = Collecting::default();
        let counters = ExportCounters::default();
        let (processor, flush) =
            QueueProcessor::spawn(exporter.clone(), settings(3, 3), counters.clone());
        // The queue holds three spans; the rest drop without waiting.
        for n in 0..8 {
            processor.on_end(span(n));
        }
        assert_eq!(counters.dropped.get(), 5);
        flush.flush(Duration::from_secs(5)).await;
        assert_eq!(counters.exported.get(), 3);
    }

    #[tokio::test]
    async fn failed_exports_are_counted() {
        let exporter = Collecting {
            fail: true,
            ..Collecting::default()
        };
        let counters = ExportCounters::default();
        let (processor, flush) =
            QueueProcessor::spawn(exporter.clone(), settings(100, 100), counters.clone());
        processor.on_end(span(1));
        processor.on_end(span(2));
        flush.flush(Duration::from_secs(5)).await;
        assert_eq!(counters.failed.get(), 2);
        assert_eq!(counters.exported.get(), 0);

        // Resting after the failure: the next batch is counted, not sent.
        processor.on_end(span(3));
        flush.flush(Duration::from_secs(5)).await;
        assert_eq!(counters.failed.get(), 3);
        assert_eq!(*exporter.batches.lock().unwrap(), vec![2]);
    }

    #[test]
    fn rests_double_up_to_a_limit_and_end_on_success() {
        let mut failures = Failures::default();
        failures.record("down");
        assert_eq!(failures.rest, Duration::from_secs(1));
        assert!(failures.resting());
        for _ in 0..10 {
            failures.record("down");
        }
        assert_eq!(failures.rest, Failures::LONGEST_REST);
        failures.recovered();
        assert!(!failures.resting());
        failures.record("down");
        assert_eq!(failures.rest, Duration::from_secs(1));
    }
}

//! The store's metrics: `Metered` wraps any backend and times every
//! operation into `clawgate_store_operation_duration_seconds{operation,
//! outcome}`. Documented in docs/metrics.md.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use clawgate_telemetry::metrics::{LatencyFamily, latency_family};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use session_store_api::StoreOperation;
use tracing::Instrument;

use crate::error::{StoreError, StoreResult};
use crate::model::*;
use crate::store::SessionStore;

type OperationLabels = [(&'static str, &'static str); 2];

/// The store's metrics. Cheap to clone; clones share the same series.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    operations: LatencyFamily<OperationLabels>,
    /// `[operation][ok, error]`, resolved once so that timing an operation
    /// is one histogram update (indexed like `StoreOperation::ALL`).
    resolved: Arc<[[Histogram; 2]; StoreOperation::ALL.len()]>,
    /// Writes refused because their owner token was stale, and renewals that
    /// found the lease gone: each is a coordinator that lost a partition and
    /// still tried to act on it.
    stale_owner: Family<OperationLabel, Counter>,
}

type OperationLabel = [(&'static str, &'static str); 1];

impl Default for StoreMetrics {
    fn default() -> Self {
        let operations = latency_family();
        let resolved = StoreOperation::ALL.map(|operation| {
            ["ok", "error"].map(|outcome| {
                operations
                    .get_or_create(&[("operation", operation.as_str()), ("outcome", outcome)])
                    .clone()
            })
        });
        Self {
            operations,
            resolved: Arc::new(resolved),
            stale_owner: Family::default(),
        }
    }
}

impl StoreMetrics {
    /// Registers the metrics under `clawgate_store`.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("clawgate_store");
        registry.register(
            "operation_duration_seconds",
            "Time a session-store operation took, by operation and outcome (ok, error)",
            self.operations.clone(),
        );
        registry.register(
            "stale_owner_refusals",
            "Writes refused with STALE_OWNER and lease renewals refused, by operation",
            self.stale_owner.clone(),
        );
    }

    fn count_stale_owner(&self, operation: StoreOperation, count: u64) {
        if count > 0 {
            self.stale_owner
                .get_or_create(&[("operation", operation.as_str())])
                .inc_by(count);
        }
    }

    fn observe(&self, operation: StoreOperation, ok: bool, started: Instant) {
        self.resolved[operation as usize][usize::from(!ok)]
            .observe(started.elapsed().as_secs_f64());
    }
}

/// A store that times every operation of the store it wraps.
pub struct Metered<S> {
    inner: S,
    metrics: StoreMetrics,
    spans: bool,
}

impl<S: SessionStore> Metered<S> {
    pub fn new(inner: S, metrics: StoreMetrics) -> Self {
        Self {
            inner,
            metrics,
            spans: false,
        }
    }

    /// Also opens a span per operation: for a store called in process (the
    /// all-in-one), where no gRPC span shows the call. Behind the gRPC
    /// server the server span already does, so it stays off there.
    pub fn with_spans(mut self) -> Self {
        self.spans = true;
        self
    }

    /// Times `call` (inside a span of its own when asked for). The span's
    /// target is under `otel`: exported with the traces, kept out of the
    /// logs.
    async fn timed<T>(
        &self,
        operation: StoreOperation,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let span = if !self.spans {
            tracing::Span::none()
        } else {
            tracing::info_span!(
            target: "otel::store",
            "store.operation",
            otel.name = format!("store.{}", operation.as_str()),
            store.operation = operation.as_str(),
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
            )
        };
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        self.metrics.observe(operation, result.is_ok(), started);
        if let Err(StoreError::StaleOwner { .. }) = &result {
            self.metrics.count_stale_owner(operation, 1);
        }
        if let Err(error) = &result {
            span.record("otel.status_code", "error");
            span.record("error.type", error.code());
        }
        result
    }
}

session_store_api::forward_store! {
    impl[S: SessionStore] SessionStore for Metered<S> {
        async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
            let call = self.inner.renew_leases(req);
            let grant = self.timed(StoreOperation::RenewLeases, call).await?;
            let refused = grant.refused.len() as u64;
            self.metrics
                .count_stale_owner(StoreOperation::RenewLeases, refused);
            Ok(grant)
        }
    }
    forward(self => self.inner, through timed) [
        acquire_writer, release_writer, append, history, get_session, list_sessions,
        reset_session, delete_session, patch_session, create_run, update_run, get_run,
        start_run, finish_run, list_active_runs, purge_expired_runs, acquire_leases,
        release_leases, list_leases, heartbeat_member, leave_member, list_members,
    ];
}

#[cfg(test)]
mod tests {
    use clawgate_telemetry::metrics::{encode, sample_value};

    use super::*;
    use crate::backend::memory::MemoryStore;
    use crate::key::SessionKey;

    fn count(text: &str, operation: &str, outcome: &str) -> Option<f64> {
        sample_value(
            text,
            "clawgate_store_operation_duration_seconds_count",
            &format!("{{operation=\"{operation}\",outcome=\"{outcome}\"}}"),
        )
    }

    #[tokio::test]
    async fn every_operation_is_timed_by_outcome() {
        let metrics = StoreMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let store = Metered::new(MemoryStore::new(), metrics);

        let key = SessionKey::parse("main").unwrap();
        store.get_session(&key).await.unwrap();
        store.release_writer(&key, "nobody", 7, None).await.ok();
        store.get_run("r1").await.unwrap();

        let text = encode(&registry).unwrap();
        assert_eq!(count(&text, "get_session", "ok"), Some(1.0));
        assert_eq!(count(&text, "get_run", "ok"), Some(1.0));
        let released = count(&text, "release_writer", "ok").unwrap()
            + count(&text, "release_writer", "error").unwrap();
        assert_eq!(released, 1.0);
        // Every series exists from the start, at zero.
        assert_eq!(count(&text, "append", "error"), Some(0.0));
    }
}

//! The store's metrics: `Metered` wraps any backend and times every
//! operation into `clawgate_store_operation_duration_seconds{operation,
//! outcome}`. Documented in docs/metrics.md.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use clawgate_telemetry::metrics::{LatencyFamily, latency_family};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::Instrument;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::store::SessionStore;

/// Every operation of the `SessionStore` trait, as a label value.
#[derive(Debug, Clone, Copy)]
enum Operation {
    AcquireWriter,
    ReleaseWriter,
    Append,
    History,
    GetSession,
    ListSessions,
    ResetSession,
    DeleteSession,
    PatchSession,
    CreateRun,
    UpdateRun,
    StartRun,
    FinishRun,
    GetRun,
    ListActiveRuns,
    PurgeExpiredRuns,
    AcquireLeases,
    RenewLeases,
    ReleaseLeases,
    ListLeases,
    HeartbeatMember,
    LeaveMember,
    ListMembers,
}

impl Operation {
    const ALL: [Self; 23] = [
        Self::AcquireWriter,
        Self::ReleaseWriter,
        Self::Append,
        Self::History,
        Self::GetSession,
        Self::ListSessions,
        Self::ResetSession,
        Self::DeleteSession,
        Self::PatchSession,
        Self::CreateRun,
        Self::UpdateRun,
        Self::StartRun,
        Self::FinishRun,
        Self::GetRun,
        Self::ListActiveRuns,
        Self::PurgeExpiredRuns,
        Self::AcquireLeases,
        Self::RenewLeases,
        Self::ReleaseLeases,
        Self::ListLeases,
        Self::HeartbeatMember,
        Self::LeaveMember,
        Self::ListMembers,
    ];

    /// `store.<operation>`: the span name.
    fn span_name(self) -> String {
        format!("store.{}", self.as_str())
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::AcquireWriter => "acquire_writer",
            Self::ReleaseWriter => "release_writer",
            Self::Append => "append",
            Self::History => "history",
            Self::GetSession => "get_session",
            Self::ListSessions => "list_sessions",
            Self::ResetSession => "reset_session",
            Self::DeleteSession => "delete_session",
            Self::PatchSession => "patch_session",
            Self::CreateRun => "create_run",
            Self::UpdateRun => "update_run",
            Self::StartRun => "start_run",
            Self::FinishRun => "finish_run",
            Self::GetRun => "get_run",
            Self::ListActiveRuns => "list_active_runs",
            Self::PurgeExpiredRuns => "purge_expired_runs",
            Self::AcquireLeases => "acquire_leases",
            Self::RenewLeases => "renew_leases",
            Self::ReleaseLeases => "release_leases",
            Self::ListLeases => "list_leases",
            Self::HeartbeatMember => "heartbeat_member",
            Self::LeaveMember => "leave_member",
            Self::ListMembers => "list_members",
        }
    }
}

type OperationLabels = [(&'static str, &'static str); 2];

/// The store's metrics. Cheap to clone; clones share the same series.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    operations: LatencyFamily<OperationLabels>,
    /// `[operation][ok, error]`, resolved once so that timing an operation
    /// is one histogram update (indexed like `Operation::ALL`).
    resolved: Arc<[[Histogram; 2]; Operation::ALL.len()]>,
    /// Writes refused because their owner token was stale, and renewals that
    /// found the lease gone: each is a coordinator that lost a partition and
    /// still tried to act on it.
    stale_owner: Family<OperationLabel, Counter>,
}

type OperationLabel = [(&'static str, &'static str); 1];

impl Default for StoreMetrics {
    fn default() -> Self {
        let operations = latency_family();
        let resolved = Operation::ALL.map(|operation| {
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

    fn count_stale_owner(&self, operation: Operation, count: u64) {
        if count > 0 {
            self.stale_owner
                .get_or_create(&[("operation", operation.as_str())])
                .inc_by(count);
        }
    }

    fn observe(&self, operation: Operation, ok: bool, started: Instant) {
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
        operation: Operation,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let span = if !self.spans {
            tracing::Span::none()
        } else {
            tracing::info_span!(
            target: "otel::store",
            "store.operation",
            otel.name = operation.span_name(),
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

#[async_trait]
impl<S: SessionStore> SessionStore for Metered<S> {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        self.timed(Operation::AcquireWriter, self.inner.acquire_writer(req))
            .await
    }
    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let call = self
            .inner
            .release_writer(key, run_id, fence_token, owner_token);
        self.timed(Operation::ReleaseWriter, call).await
    }
    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        self.timed(Operation::Append, self.inner.append(req)).await
    }
    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        self.timed(Operation::History, self.inner.history(query))
            .await
    }
    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        self.timed(Operation::GetSession, self.inner.get_session(key))
            .await
    }
    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        self.timed(Operation::ListSessions, self.inner.list_sessions(query))
            .await
    }
    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        self.timed(Operation::ResetSession, self.inner.reset_session(key))
            .await
    }
    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let call = self.inner.delete_session(key, delete_transcript);
        self.timed(Operation::DeleteSession, call).await
    }
    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        let call = self.inner.patch_session(req);
        self.timed(Operation::PatchSession, call).await
    }
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        self.timed(Operation::CreateRun, self.inner.create_run(new))
            .await
    }
    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        self.timed(Operation::UpdateRun, self.inner.update_run(update))
            .await
    }
    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        self.timed(Operation::StartRun, self.inner.start_run(req))
            .await
    }
    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        self.timed(Operation::FinishRun, self.inner.finish_run(req))
            .await
    }
    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        self.timed(Operation::GetRun, self.inner.get_run(run_id))
            .await
    }
    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        let call = self.inner.list_active_runs(owner);
        self.timed(Operation::ListActiveRuns, call).await
    }
    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        let call = self.inner.purge_expired_runs(ended_before_ms);
        self.timed(Operation::PurgeExpiredRuns, call).await
    }
    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        let call = self.inner.acquire_leases(req);
        self.timed(Operation::AcquireLeases, call).await
    }
    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        let call = self.inner.renew_leases(req);
        let grant = self.timed(Operation::RenewLeases, call).await?;
        let refused = grant.refused.len() as u64;
        self.metrics
            .count_stale_owner(Operation::RenewLeases, refused);
        Ok(grant)
    }
    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        let call = self.inner.release_leases(tokens);
        self.timed(Operation::ReleaseLeases, call).await
    }
    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        self.timed(Operation::ListLeases, self.inner.list_leases())
            .await
    }
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        let call = self.inner.heartbeat_member(req);
        self.timed(Operation::HeartbeatMember, call).await
    }
    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        let call = self.inner.leave_member(member);
        self.timed(Operation::LeaveMember, call).await
    }
    async fn list_members(&self) -> StoreResult<MemberTable> {
        self.timed(Operation::ListMembers, self.inner.list_members())
            .await
    }
}

#[cfg(test)]
mod tests {
    use clawgate_telemetry::metrics::{encode, sample_value};

    use super::*;
    use crate::backend::memory::MemoryStore;

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

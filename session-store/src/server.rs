//! `serve(config, listener, shutdown)`: the session-store gRPC server as used
//! by `main`, by tests and by the all-in-one launcher.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clawgate_proto::session_store::v1::session_store_server::SessionStoreServer;
use clawgate_telemetry::metrics::spawn_metrics_server;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::Server;

use crate::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::backend::postgres::{PgOptions, PostgresStore};
use crate::config::{BackendLocation, StoreConfig};
use crate::deadline::{DEFAULT_OPERATION_TIMEOUT, Deadlined};
use crate::grpc::MAX_MESSAGE_BYTES;
use crate::grpc::service::SessionStoreService;
use crate::limits::{Checked, Limits};
use crate::metrics::{Metered, StoreMetrics};
use crate::store::SessionStore;
use clawgate_common::clock::now_ms;

/// What the server does besides answering calls.
#[derive(Debug)]
pub struct ServeOptions {
    pub limits: Limits,
    pub run_retention: Duration,
    pub purge_interval: Duration,
    /// Times every operation served. A clone may time in-process callers
    /// of the same backend too (the all-in-one launcher's coordinator).
    pub metrics: StoreMetrics,
    /// Where `/metrics` is served; none, no endpoint.
    pub metrics_listener: Option<TcpListener>,
    /// Largest gRPC message accepted or sent.
    pub grpc_max_message_bytes: usize,
    /// The callers served, by token (the store's table says what each
    /// kind may call); none, every call is served.
    pub service_tokens: Option<clawgate_telemetry::CallerTokens>,
    /// Every operation answers within this, or UNAVAILABLE.
    pub operation_timeout: Duration,
    /// TLS (and mTLS) of the gRPC server; none, plaintext.
    pub tls: Option<clawgate_telemetry::tls::ServerTls>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            run_retention: Duration::from_secs(24 * 3600),
            purge_interval: Duration::from_secs(60),
            metrics: StoreMetrics::default(),
            metrics_listener: None,
            grpc_max_message_bytes: MAX_MESSAGE_BYTES,
            service_tokens: None,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            tls: None,
        }
    }
}

impl From<&StoreConfig> for ServeOptions {
    fn from(config: &StoreConfig) -> Self {
        Self {
            limits: (&config.limits).into(),
            run_retention: config.run_retention,
            purge_interval: config.purge_interval,
            grpc_max_message_bytes: config.grpc_max_message_bytes,
            service_tokens: config.callers.accepted(config.service_token.as_ref()),
            operation_timeout: config.operation_timeout,
            ..Self::default()
        }
    }
}

/// Opens the backend the configuration names.
pub async fn open_backend(config: &StoreConfig) -> anyhow::Result<Arc<dyn SessionStore>> {
    Ok(match BackendLocation::parse(&config.store) {
        BackendLocation::Embedded(path) => {
            let options = EmbeddedOptions {
                max_batch: config.group_commit_max,
                partitions: config.partitions,
                max_settings_bytes: config.limits.max_settings_bytes,
                max_members: config.limits.max_members,
                ..EmbeddedOptions::default()
            };
            let store = EmbeddedStore::open(&path, options)
                .await
                .with_context(|| format!("opening the embedded store {}", path.display()))?;
            tracing::info!(path = %path.display(), "embedded store open");
            Arc::new(store)
        }
        BackendLocation::Postgres(url) => {
            let options = PgOptions {
                schema: config.pg_schema.clone(),
                pool_size: config.pg_pool_size,
                admission_pool_size: config.pg_admission_pool_size,
                partitions: config.partitions,
                max_settings_bytes: config.limits.max_settings_bytes,
                max_members: config.limits.max_members,
            };
            let store = PostgresStore::connect(&url, options)
                .await
                .context("connecting to PostgreSQL")?;
            tracing::info!("PostgreSQL store connected, migrations applied");
            Arc::new(store)
        }
    })
}

pub async fn serve(
    config: StoreConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.check().map_err(anyhow::Error::msg)?;
    let options = ServeOptions {
        metrics_listener: Some(TcpListener::bind(config.metrics_listen).await?),
        tls: config.tls.server().map_err(anyhow::Error::msg)?,
        ..ServeOptions::from(&config)
    };
    check_transport(&options)?;
    let backend = open_backend(&config).await?;
    serve_store(backend, options, listener, shutdown).await
}

/// Serves `backend` (checked against the limits, every operation bounded
/// by the operation timeout and timed) until `shutdown` resolves, then
/// drains in-flight calls.
pub async fn serve_store(
    backend: Arc<dyn SessionStore>,
    options: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let checked = Checked::new(backend, options.limits.clone());
    let store: Arc<dyn SessionStore> = Arc::new(Metered::new(
        Deadlined::new(checked, options.operation_timeout),
        options.metrics.clone(),
    ));
    let _metrics_server = options.metrics_listener.map(|listener| {
        let mut registry = clawgate_telemetry::metrics::service_registry();
        options.metrics.register(&mut registry);
        spawn_metrics_server(listener, Arc::new(registry))
    });
    // Ends the open WatchLeases streams at shutdown, so that draining does
    // not wait for watchers that never finish by themselves.
    let stopping = CancellationToken::new();
    let service = SessionStoreService::new(store.clone()).with_stopping(stopping.clone());
    let grpc = SessionStoreServer::new(service)
        .max_decoding_message_size(options.grpc_max_message_bytes)
        .max_encoding_message_size(options.grpc_max_message_bytes);

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<SessionStoreServer<SessionStoreService>>()
        .await;
    let (reflection, reflection_v1alpha) = clawgate_common::reflection_services(&[
        <SessionStoreServer<SessionStoreService> as NamedService>::NAME,
    ])
    .context("building the reflection service")?;

    let purger = tokio::spawn(purge_expired_runs(
        store,
        options.run_retention,
        options.purge_interval,
    ));
    let address = listener.local_addr()?;
    tracing::info!(%address, tls = options.tls.is_some(), "session store serving gRPC");
    let incoming = clawgate_telemetry::tls::incoming(listener, options.tls.as_ref());
    let result = Server::builder()
        .layer(clawgate_telemetry::GrpcServerTraceLayer)
        .layer(clawgate_telemetry::ServiceAuthLayer::new(
            options.service_tokens.clone(),
            &crate::grpc::access::STORE_ACCESS,
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(grpc)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            tracing::info!("session store shutting down");
            health
                .set_not_serving::<SessionStoreServer<SessionStoreService>>()
                .await;
            stopping.cancel();
        })
        .await;
    purger.abort();
    result.context("gRPC server")
}

/// Refuses limits under which a request they allow could not travel over
/// gRPC, or an entry they allow could never be appended (docs/limits.md).
/// Checked before the backend is opened (the binary and the all-in-one).
pub fn check_transport(options: &ServeOptions) -> anyhow::Result<()> {
    use clawgate_common::limits::ENVELOPE_BYTES;
    let ceiling = options.grpc_max_message_bytes;
    let limits = &options.limits;
    for (name, bytes) in [
        ("SESSION_STORE_MAX_APPEND_BYTES", limits.max_append_bytes),
        (
            "SESSION_STORE_MAX_RUN_PAYLOAD_BYTES",
            limits.max_run_payload_bytes,
        ),
    ] {
        anyhow::ensure!(
            bytes.saturating_add(ENVELOPE_BYTES) <= ceiling,
            "{name} ({bytes}) plus {ENVELOPE_BYTES} bytes of envelope must fit \
             SESSION_STORE_GRPC_MAX_MESSAGE_BYTES ({ceiling})"
        );
    }
    anyhow::ensure!(
        limits.max_entry_bytes <= limits.max_append_bytes,
        "SESSION_STORE_MAX_ENTRY_BYTES ({}) must be at most SESSION_STORE_MAX_APPEND_BYTES ({})",
        limits.max_entry_bytes,
        limits.max_append_bytes
    );
    Ok(())
}

/// Removes terminal run records older than the retention, forever.
async fn purge_expired_runs(store: Arc<dyn SessionStore>, retention: Duration, every: Duration) {
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let cutoff = now_ms() - retention.as_millis() as i64;
        match store.purge_expired_runs(cutoff).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "expired run records purged"),
            Err(e) => {
                clawgate_telemetry::limited!(warn, error = %e, "purging expired run records failed")
            }
        }
    }
}

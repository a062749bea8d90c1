//! `serve(args, listener, shutdown)`: the coordinator's gRPC server, used by
//! its binary, by tests and by the all-in-one launcher.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clawgate_proto::run_coordinator::v1::run_coordinator_server::RunCoordinatorServer;
use clawgate_telemetry::metrics::spawn_metrics_server;
use session_store_api::grpc::client::RemoteStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::cli::ServeArgs;
use crate::coordinator::Coordinator;
use crate::grpc::service::RunCoordinatorService;

/// Starts a coordinator against the session store at `args.store_address`
/// and serves it until `shutdown`.
pub async fn serve(
    args: ServeArgs,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    check_transport(&args)?;
    let store = RemoteStore::connect_with(&args.store_address, args.service_token.as_ref())
        .await
        .context("connecting to the session store")?;
    let metrics_listener = TcpListener::bind(args.metrics_listen).await?;
    let runtime = args.coordinator.runtime.build().await?;
    let mut config = args.coordinator.config();
    if config.ownership.advertise_address.is_empty() {
        config.ownership.advertise_address = format!("http://{}", listener.local_addr()?);
    }
    let coordinator = Coordinator::start(Arc::new(store), runtime, config)
        .await
        .context("starting the coordinator")?;
    let options = ServeOptions {
        drain_timeout: args.coordinator.drain_timeout,
        grpc_max_message_bytes: args.grpc_max_message_bytes,
        metrics_listener: Some(metrics_listener),
        service_tokens: args.service_token.clone(),
    };
    serve_coordinator(coordinator, options, listener, shutdown).await
}

/// How a started coordinator is served.
#[derive(Debug)]
pub struct ServeOptions {
    /// On shutdown: how long executing runs may take to finish.
    pub drain_timeout: Duration,
    /// Largest gRPC message accepted or sent.
    pub grpc_max_message_bytes: usize,
    /// Where `/metrics` is served; none, no endpoint.
    pub metrics_listener: Option<TcpListener>,
    /// Calls without one of these are refused; none, every call is served.
    pub service_tokens: Option<clawgate_telemetry::ServiceTokens>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            grpc_max_message_bytes: clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES,
            metrics_listener: None,
            service_tokens: None,
        }
    }
}

/// Refuses a gRPC ceiling below the largest Submit the limits allow, so a
/// request too large is refused by the limit meant for it, by name. Checked
/// before anything starts (the standalone binary and the all-in-one).
pub fn check_transport(args: &ServeArgs) -> anyhow::Result<()> {
    use clawgate_common::limits::{ENVELOPE_BYTES, submit_bytes_needed};
    let (limits, ceiling) = (&args.coordinator, args.grpc_max_message_bytes);
    let largest_submit = submit_bytes_needed(
        limits.max_message_bytes,
        limits.max_options_bytes,
        limits.max_label_chars,
        limits.max_requester_chars,
    ) + limits.max_attachment_bytes
        + limits.max_attachments * ENVELOPE_BYTES;
    anyhow::ensure!(
        largest_submit <= ceiling,
        "COORDINATOR_GRPC_MAX_MESSAGE_BYTES ({ceiling}) must hold the largest Submit the \
         limits allow ({largest_submit} bytes: COORDINATOR_MAX_MESSAGE_BYTES, \
         COORDINATOR_MAX_OPTIONS_BYTES, the label and requester, and {ENVELOPE_BYTES} bytes \
         of envelope)"
    );
    Ok(())
}

/// Serves a started coordinator, and its `/metrics` on the options'
/// metrics listener when given. Health is SERVING while it owns partitions
/// (a standby is NOT_SERVING). On `shutdown`: health turns NOT_SERVING,
/// admission stops, executing runs get the drain timeout to finish (then are
/// aborted), the leases are released, open subscriptions and waits end, and
/// the server stops. When the tenure ends (another coordinator took the
/// partitions) it stops the same way, at once, and returns an error saying
/// why: the process exits non-zero.
pub async fn serve_coordinator(
    coordinator: Coordinator,
    options: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let drain_timeout = options.drain_timeout;
    // How long a coordinator that lost its tenure keeps asking the store
    // for its verdict before it exits.
    let settle_patience = 2 * coordinator.inner.config.ownership.lease_ttl;
    let loss_verdict = Arc::new(std::sync::Mutex::new(None::<String>));
    let _metrics_server = options.metrics_listener.map(|listener| {
        let mut registry = clawgate_telemetry::metrics::service_registry();
        coordinator.register_metrics(&mut registry);
        spawn_metrics_server(listener, Arc::new(registry))
    });
    let stopping = CancellationToken::new();
    let service = RunCoordinatorServer::new(RunCoordinatorService::new(
        coordinator.clone(),
        stopping.clone(),
    ))
    .max_decoding_message_size(options.grpc_max_message_bytes)
    .max_encoding_message_size(options.grpc_max_message_bytes);
    let (health, health_service) = tonic_health::server::health_reporter();
    let ownership = coordinator.ownership().clone();
    // The first status is set before the server accepts a call, so health
    // never answers "not registered"; the task follows the changes.
    let mut serving = ownership.serving();
    let first = *serving.borrow_and_update();
    set_health(&health, first).await;
    let follow_health = tokio::spawn(follow_ownership(health.clone(), serving));
    let (reflection, reflection_v1alpha) = clawgate_common::reflection_services(&[
        <RunCoordinatorServer<RunCoordinatorService> as NamedService>::NAME,
    ])
    .context("building the reflection service")?;
    let address = listener.local_addr()?;
    tracing::info!(%address, epoch = coordinator.epoch(), "run coordinator serving gRPC");
    Server::builder()
        .layer(clawgate_telemetry::GrpcServerTraceLayer)
        .layer(clawgate_telemetry::ServiceAuthLayer::new(
            options.service_tokens.clone(),
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), {
            let ownership = ownership.clone();
            let loss_verdict = loss_verdict.clone();
            async move {
                let lost = ownership.lost();
                let planned = tokio::select! {
                    () = shutdown => true,
                    () = lost.cancelled() => false,
                };
                follow_health.abort();
                health
                    .set_not_serving::<RunCoordinatorServer<RunCoordinatorService>>()
                    .await;
                if planned {
                    tracing::info!("run coordinator draining");
                    coordinator.hand_over(drain_timeout).await;
                } else {
                    // Nothing this instance still writes can land:
                    // abort at once; the new owner settles the runs.
                    coordinator.drain(Duration::ZERO).await;
                    let verdict = coordinator.settle_loss(settle_patience).await;
                    *loss_verdict.lock().unwrap() = Some(verdict);
                }
                stopping.cancel();
            }
        })
        .await
        .context("gRPC server")?;
    match ownership.lost_reason() {
        Some(reason) => match loss_verdict.lock().unwrap().take() {
            Some(verdict) => anyhow::bail!(
                "STALE_OWNER: this coordinator stopped: {reason}; the store's verdict: {verdict}"
            ),
            None => anyhow::bail!("STALE_OWNER: this coordinator stopped: {reason}"),
        },
        None => Ok(()),
    }
}

/// Keeps gRPC health in step with ownership: SERVING while any partition is
/// held.
async fn follow_ownership(
    health: tonic_health::server::HealthReporter,
    mut serving: tokio::sync::watch::Receiver<bool>,
) {
    while serving.changed().await.is_ok() {
        let now = *serving.borrow_and_update();
        set_health(&health, now).await;
    }
}

async fn set_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    if serving {
        health
            .set_serving::<RunCoordinatorServer<RunCoordinatorService>>()
            .await;
    } else {
        health
            .set_not_serving::<RunCoordinatorServer<RunCoordinatorService>>()
            .await;
    }
}

//! `serve(args, listener, shutdown)`: the coordinator's gRPC server, used by
//! its binary, by tests and by the all-in-one launcher.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clawgate_proto::run_coordinator::v1::run_coordinator_server::RunCoordinatorServer;
use clawgate_telemetry::metrics::spawn_metrics_server;
use session_store::grpc::client::RemoteStore;
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
    let store = RemoteStore::connect(&args.store_address)
        .await
        .context("connecting to the session store")?;
    let metrics_listener = TcpListener::bind(args.metrics_listen).await?;
    let runtime = args.coordinator.runtime.build().await?;
    let coordinator = Coordinator::start(Arc::new(store), runtime, args.coordinator.config())
        .await
        .context("starting the coordinator")?;
    serve_coordinator(
        coordinator,
        args.coordinator.drain_timeout,
        listener,
        Some(metrics_listener),
        shutdown,
    )
    .await
}

/// Serves a started coordinator, and its `/metrics` on `metrics_listener`
/// when given. On `shutdown`: health turns NOT_SERVING, admission stops,
/// executing runs get `drain_timeout` to finish (then are aborted), open
/// subscriptions and waits end, and the server stops.
pub async fn serve_coordinator(
    coordinator: Coordinator,
    drain_timeout: Duration,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let _metrics_server = metrics_listener.map(|listener| {
        let mut registry = clawgate_telemetry::metrics::service_registry();
        coordinator.register_metrics(&mut registry);
        spawn_metrics_server(listener, Arc::new(registry))
    });
    let stopping = CancellationToken::new();
    let service = RunCoordinatorServer::new(RunCoordinatorService::new(
        coordinator.clone(),
        stopping.clone(),
    ));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RunCoordinatorServer<RunCoordinatorService>>()
        .await;
    let (reflection, reflection_v1alpha) = clawgate_common::reflection_services(&[
        <RunCoordinatorServer<RunCoordinatorService> as NamedService>::NAME,
    ])
    .context("building the reflection service")?;
    let address = listener.local_addr()?;
    tracing::info!(%address, epoch = coordinator.epoch(), "run coordinator serving gRPC");
    Server::builder()
        .layer(clawgate_telemetry::GrpcServerTraceLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async move {
                shutdown.await;
                tracing::info!("run coordinator draining");
                health
                    .set_not_serving::<RunCoordinatorServer<RunCoordinatorService>>()
                    .await;
                coordinator.drain(drain_timeout).await;
                stopping.cancel();
            },
        )
        .await
        .context("gRPC server")
}

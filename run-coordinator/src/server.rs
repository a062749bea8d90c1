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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::Server;

use crate::cli::ServeArgs;
use crate::coordinator::Coordinator;
use crate::grpc::service::RunCoordinatorService;
use crate::stop::{LossDeadlines, PLANNED_STOP_GRACE};

/// Starts a coordinator against the session store at `args.store_address`
/// and serves it until `shutdown`: the standalone binary's entry, so a
/// lost tenure also starts the watchdog that ends the process.
pub async fn serve(
    args: ServeArgs,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    args.check().map_err(anyhow::Error::msg)?;
    check_transport(&args)?;
    let server_tls = args.tls.server().map_err(anyhow::Error::msg)?;
    let client_tls = args.tls.client().map_err(anyhow::Error::msg)?;
    let store = RemoteStore::connect_with(
        &args.store_address,
        args.service_token.as_ref(),
        Some(&client_tls),
    )
    .await
    .context("connecting to the session store")?;
    let metrics_listener = TcpListener::bind(args.metrics_listen).await?;
    let runtime = args.coordinator.runtime.build(Some(&client_tls)).await?;
    let mut config = args.coordinator.config();
    if config.ownership.advertise_address.is_empty() {
        let scheme = if server_tls.is_some() {
            "https"
        } else {
            "http"
        };
        config.ownership.advertise_address = format!("{scheme}://{}", listener.local_addr()?);
    }
    let coordinator = Coordinator::start(Arc::new(store), runtime, config)
        .await
        .context("starting the coordinator")?;
    let options = ServeOptions {
        drain_timeout: args.coordinator.drain_timeout,
        grpc_max_message_bytes: args.grpc_max_message_bytes,
        metrics_listener: Some(metrics_listener),
        service_tokens: args.callers.accepted(args.service_token.as_ref()),
        loss_watchdog: true,
        tls: server_tls,
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
    /// The callers served, by token (the coordinator's table says what
    /// each kind may call); none, every call is served.
    pub service_tokens: Option<clawgate_telemetry::CallerTokens>,
    /// After a lost tenure, end the process if the stop has not ended it
    /// by its deadline (`stop.rs`): for a process whose end is the remedy
    /// (the coordinator's binary, the all-in-one), never for a test.
    pub loss_watchdog: bool,
    /// TLS (and mTLS) of the gRPC server; none, plaintext.
    pub tls: Option<clawgate_telemetry::tls::ServerTls>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            grpc_max_message_bytes: clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES,
            metrics_listener: None,
            service_tokens: None,
            loss_watchdog: false,
            tls: None,
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
/// why: the process exits non-zero. Either stop has a deadline
/// (`stop.rs`): calls still open past it are left behind.
pub async fn serve_coordinator(
    coordinator: Coordinator,
    options: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
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
    tracing::info!(
        %address,
        epoch = coordinator.epoch(),
        tls = options.tls.is_some(),
        "run coordinator serving gRPC"
    );
    let stop = Stop {
        coordinator,
        health,
        follow_health,
        stopping,
        drain_timeout: options.drain_timeout,
        watchdog: options.loss_watchdog,
        deadline: Arc::new(tokio::sync::watch::Sender::new(None)),
        verdict: Arc::new(std::sync::Mutex::new(None)),
    };
    let mut deadline = stop.deadline.subscribe();
    let verdict = stop.verdict.clone();
    let server = Server::builder()
        .layer(clawgate_telemetry::GrpcServerTraceLayer)
        .layer(clawgate_telemetry::ServiceAuthLayer::new(
            options.service_tokens.clone(),
            &crate::grpc::access::COORDINATOR_ACCESS,
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(
            clawgate_telemetry::tls::incoming(listener, options.tls.as_ref()),
            stop.run(shutdown),
        );
    // The server returns once every open call ended; one that does not end
    // by the stop's deadline is left behind.
    let overdue = async {
        let Ok(at) = deadline.wait_for(Option::is_some).await.map(|at| *at) else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at.expect("waited for a deadline")).await;
    };
    tokio::select! {
        served = server => served.context("gRPC server")?,
        () = overdue => tracing::warn!("open calls outlived the stop's deadline; stopping without them"),
    }
    match ownership.lost_reason() {
        Some(reason) => match verdict.lock().unwrap().take() {
            Some(verdict) => anyhow::bail!(
                "STALE_OWNER: this coordinator stopped: {reason}; the store's verdict: {verdict}"
            ),
            None => anyhow::bail!("STALE_OWNER: this coordinator stopped: {reason}"),
        },
        None => Ok(()),
    }
}

/// What the server's shutdown future needs: the stop, planned or after a
/// loss, with its deadline published for the server's caller.
struct Stop {
    coordinator: Coordinator,
    health: tonic_health::server::HealthReporter,
    follow_health: tokio::task::JoinHandle<()>,
    /// Ends open subscriptions and waits.
    stopping: CancellationToken,
    drain_timeout: Duration,
    watchdog: bool,
    /// When the stop must be over, once it began.
    deadline: Arc<tokio::sync::watch::Sender<Option<Instant>>>,
    /// The store's verdict after a loss, for the exit message.
    verdict: Arc<std::sync::Mutex<Option<String>>>,
}

impl Stop {
    /// Waits for `shutdown` or the end of the tenure, then stops.
    async fn run(self, shutdown: impl Future<Output = ()>) {
        let ownership = self.coordinator.ownership().clone();
        let lost = ownership.lost();
        let planned = tokio::select! {
            () = shutdown => true,
            () = lost.cancelled() => false,
        };
        let began = Instant::now();
        self.follow_health.abort();
        if planned {
            self.deadline
                .send_replace(Some(began + self.drain_timeout + PLANNED_STOP_GRACE));
            self.set_not_serving().await;
            tracing::info!("run coordinator draining");
            self.coordinator.hand_over(self.drain_timeout).await;
        } else {
            let ttl = self.coordinator.inner.config.ownership.lease_ttl;
            let deadlines = LossDeadlines::new(began, ttl);
            self.deadline.send_replace(Some(deadlines.calls));
            if self.watchdog {
                let reason = ownership.lost_reason().unwrap_or_default();
                deadlines.start_watchdog(reason);
            }
            self.set_not_serving().await;
            // Nothing this instance still writes can land: abort at once;
            // the new owner settles the runs.
            let aborted =
                tokio::time::timeout_at(deadlines.abort, self.coordinator.drain(Duration::ZERO));
            if aborted.await.is_err() {
                tracing::warn!("executing runs did not settle in time after the loss");
            }
            let verdict = self.coordinator.settle_loss(deadlines.verdict).await;
            *self.verdict.lock().unwrap() = Some(verdict);
        }
        self.stopping.cancel();
    }

    async fn set_not_serving(&self) {
        self.health
            .set_not_serving::<RunCoordinatorServer<RunCoordinatorService>>()
            .await;
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

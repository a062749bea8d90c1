//! `clawgate`: the whole system in one process for a laptop or a test — the
//! session store (embedded by default), the run coordinator (echo runtime by
//! default), each on its own gRPC port, and the gateway edge (OpenClaw
//! protocol v4 over WebSocket) in front. The coordinator calls the store in
//! process; the edge reaches both over gRPC, exactly as in a deployment.

use std::net::SocketAddr;
use std::sync::Arc;

use clawgate::config::Settings;
use gateway_edge::config::AuthMode;
use run_coordinator::Coordinator;
use session_store::limits::Checked;
use session_store::metrics::Metered;
use session_store::server::{ServeOptions, open_backend, serve_store};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The addresses the listeners actually bound (a port 0 resolved).
struct Bound {
    store: SocketAddr,
    store_metrics: SocketAddr,
    coordinator: SocketAddr,
    coordinator_metrics: SocketAddr,
    edge: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telemetry = clawgate_telemetry::init("clawgate");
    let settings = Settings::parse();
    settings.check_limits()?;
    let Settings {
        store: store_config,
        coordinator: coordinator_args,
        edge: mut edge_config,
    } = settings;
    if edge_config.auth_mode == AuthMode::Token && edge_config.token.is_none() {
        edge_config.token = Some(uuid::Uuid::new_v4().simple().to_string());
    }
    edge_config.check()?;
    anyhow::ensure!(
        store_config.service_token == coordinator_args.service_token
            && coordinator_args.service_token == edge_config.service_token,
        "the three services need the same service token: set CLAWGATE_SERVICE_TOKEN, or \
         --store-service-token, --coordinator-service-token and --edge-service-token alike"
    );
    // Everything binds first, so that a port 0 becomes the real port that
    // the edge is given and that is printed.
    let store_metrics_listener = TcpListener::bind(store_config.metrics_listen).await?;
    let store_listener = TcpListener::bind(store_config.listen).await?;
    let coordinator_listener = TcpListener::bind(coordinator_args.listen).await?;
    let coordinator_metrics_listener = TcpListener::bind(coordinator_args.metrics_listen).await?;
    let edge_listener = TcpListener::bind(edge_config.listen).await?;
    let bound = Bound {
        store: store_listener.local_addr()?,
        store_metrics: store_metrics_listener.local_addr()?,
        coordinator: coordinator_listener.local_addr()?,
        coordinator_metrics: coordinator_metrics_listener.local_addr()?,
        edge: edge_listener.local_addr()?,
    };
    let options = ServeOptions {
        metrics_listener: Some(store_metrics_listener),
        ..ServeOptions::from(&store_config)
    };
    let backend = open_backend(&store_config).await?;

    // The coordinator calls the store in process: the same checks, its
    // calls timed into the same series as the served ones, and a span per
    // call where a deployment would show the gRPC hop.
    let store = Arc::new(
        Metered::new(
            Checked::new(backend.clone(), options.limits.clone()),
            options.metrics.clone(),
        )
        .with_spans(),
    );
    let store_stop = CancellationToken::new();
    let store_server = tokio::spawn(serve_store(
        backend,
        options,
        store_listener,
        store_stop.clone().cancelled_owned(),
    ));
    let coordinator_settings = &coordinator_args.coordinator;
    let runtime = coordinator_settings.runtime.build().await?;
    let coordinator = Coordinator::start(store, runtime, coordinator_settings.config()).await?;
    edge_config.coordinator_address = format!("http://{}", bound.coordinator);
    edge_config.store_address = format!("http://{}", bound.store);
    edge_config.listen = bound.edge;
    let auth = match edge_config.auth_mode {
        AuthMode::Token => format!("token {}", edge_config.token.as_deref().unwrap_or_default()),
        AuthMode::Password => "password (EDGE_PASSWORD)".to_owned(),
        AuthMode::None => "none (loopback only)".to_owned(),
    };
    let edge_stop = CancellationToken::new();
    let edge_server = tokio::spawn(gateway_edge::server::serve(
        edge_config,
        edge_listener,
        edge_stop.clone().cancelled_owned(),
    ));
    println!("clawgate is up");
    println!("  gateway (OpenClaw protocol v4)  ws://{}", bound.edge);
    println!("  auth                            {auth}");
    println!("  session store                   grpc://{}", bound.store);
    println!(
        "  run coordinator                 grpc://{}  (runtime: {:?})",
        bound.coordinator, coordinator_settings.runtime.runtime
    );
    println!(
        "  metrics                         http://{}/metrics (edge)",
        bound.edge
    );
    println!(
        "                                  http://{}/metrics (store)",
        bound.store_metrics
    );
    println!(
        "                                  http://{}/metrics (coordinator)",
        bound.coordinator_metrics
    );
    println!("  data                            {}", store_config.store);
    if telemetry.exporting() {
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .unwrap_or_default();
        println!("  traces (OTLP/gRPC)              {endpoint}");
    }

    // On a signal: the edge says `shutdown` and closes its sockets, the
    // coordinator drains, and the store it writes to stops last.
    let signal = async move {
        clawgate_common::shutdown_signal().await;
        edge_stop.cancel();
        let _ = edge_server.await;
    };
    let options = run_coordinator::server::ServeOptions {
        drain_timeout: coordinator_settings.drain_timeout,
        grpc_max_message_bytes: coordinator_args.grpc_max_message_bytes,
        metrics_listener: Some(coordinator_metrics_listener),
        service_tokens: coordinator_args.service_token.clone(),
    };
    let served = run_coordinator::server::serve_coordinator(
        coordinator,
        options,
        coordinator_listener,
        signal,
    )
    .await;
    store_stop.cancel();
    store_server.await??;
    telemetry.shutdown(clawgate_telemetry::SHUTDOWN_FLUSH).await;
    served
}

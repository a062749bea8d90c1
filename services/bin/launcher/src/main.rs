//! `clawgate`: the whole system in one process for a laptop or a test — the
//! session store (embedded by default), the run coordinator (echo runtime by
//! default), each on its own gRPC port, and the gateway edge (OpenClaw
//! protocol v4 over WebSocket) in front. The coordinator calls the store in
//! process; the edge reaches both over gRPC, exactly as in a deployment.

// The system allocator, not mimalloc: see `clawgate_common::allocator`
// (this process serves the edge, whose memory per client is a bound it
// promises).

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
    edge_metrics: Option<SocketAddr>,
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
    // A token made up here is printed (no one else knows it); one given
    // is the operator's and is never printed.
    let made_token = edge_config.auth_mode == AuthMode::Token && edge_config.token.is_none();
    if made_token {
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
    let edge_metrics_listener = match edge_config.metrics_on_public_port {
        true => None,
        false => Some(TcpListener::bind(edge_config.metrics_listen).await?),
    };
    let bound = Bound {
        store: store_listener.local_addr()?,
        store_metrics: store_metrics_listener.local_addr()?,
        coordinator: coordinator_listener.local_addr()?,
        coordinator_metrics: coordinator_metrics_listener.local_addr()?,
        edge: edge_listener.local_addr()?,
        edge_metrics: edge_metrics_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?,
    };
    // Plaintext on loopback unless the TLS flags say otherwise: then the
    // edge's hops to the store and the coordinator are TLS too.
    let store_tls = store_config.tls.server().map_err(anyhow::Error::msg)?;
    let coordinator_tls = coordinator_args.tls.server().map_err(anyhow::Error::msg)?;
    let scheme = |tls: &Option<_>| if tls.is_some() { "https" } else { "http" };
    let (store_scheme, coordinator_scheme) = (scheme(&store_tls), scheme(&coordinator_tls));
    let options = ServeOptions {
        metrics_listener: Some(store_metrics_listener),
        tls: store_tls,
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
    let runtime_tls = coordinator_args.tls.client().map_err(anyhow::Error::msg)?;
    let runtime = coordinator_settings
        .runtime
        .build(Some(&runtime_tls))
        .await?;
    let coordinator = Coordinator::start(store, runtime, coordinator_settings.config()).await?;
    edge_config.coordinator_address = format!("{coordinator_scheme}://{}", bound.coordinator);
    edge_config.store_address = format!("{store_scheme}://{}", bound.store);
    edge_config.listen = bound.edge;
    let auth = match edge_config.auth_mode {
        AuthMode::Token if made_token => {
            format!("token {}", edge_config.token.as_deref().unwrap_or_default())
        }
        AuthMode::Token => "token (the one given: EDGE_TOKEN)".to_owned(),
        AuthMode::Password => "password (EDGE_PASSWORD)".to_owned(),
        AuthMode::None => "none (loopback only)".to_owned(),
    };
    let edge_stop = CancellationToken::new();
    let edge_server = tokio::spawn(gateway_edge::serve_with_metrics(
        edge_config,
        edge_listener,
        edge_metrics_listener,
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
        bound.edge_metrics.unwrap_or(bound.edge)
    );
    println!(
        "                                  http://{}/metrics (store)",
        bound.store_metrics
    );
    println!(
        "                                  http://{}/metrics (coordinator)",
        bound.coordinator_metrics
    );
    println!(
        "  data                            {}",
        without_password(&store_config.store)
    );
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
        service_tokens: coordinator_args
            .callers
            .accepted(coordinator_args.service_token.as_ref()),
        // This process is the coordinator's: its end is the remedy.
        loss_watchdog: true,
        tls: coordinator_tls,
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

/// The store's location as it may be printed: a PostgreSQL URL's password
/// (`postgres://user:secret@host/db`) replaced by `***`; a file path as it is.
fn without_password(store: &str) -> String {
    let Some((scheme, rest)) = store.split_once("://") else {
        return store.to_owned();
    };
    // Query parameters may carry it too (`?password=`): the query goes.
    let rest = match rest.split_once('?') {
        Some((before, query)) if query.to_ascii_lowercase().contains("password") => {
            format!("{before}?***")
        }
        _ => rest.to_owned(),
    };
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest.as_str(), String::new()), |(a, p)| {
            (a, format!("/{p}"))
        });
    let Some((credentials, host)) = authority.rsplit_once('@') else {
        return format!("{scheme}://{rest}");
    };
    let user = credentials
        .split_once(':')
        .map_or(credentials, |(user, _)| user);
    let hidden = if credentials.contains(':') {
        ":***"
    } else {
        ""
    };
    format!("{scheme}://{user}{hidden}@{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn the_store_url_is_printed_without_its_password() {
        assert_eq!(
            without_password("postgres://app:s3cr:et@db.internal:5432/clawgate"),
            "postgres://app:***@db.internal:5432/clawgate"
        );
        assert_eq!(
            without_password("postgres://app@db/clawgate?sslmode=require"),
            "postgres://app@db/clawgate?sslmode=require"
        );
        assert_eq!(
            without_password("postgresql://db/clawgate?user=app&password=x"),
            "postgresql://db/clawgate?***"
        );
        assert_eq!(without_password("clawgate.redb"), "clawgate.redb");
    }
}

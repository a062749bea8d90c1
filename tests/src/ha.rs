//! Pieces of the multi-process high-availability tests: a store on
//! PostgreSQL, lease-mode coordinators, an edge that knows several
//! coordinators, gRPC health, and the store's STALE_OWNER count.

use std::time::Duration;

use clawgate_telemetry::metrics::{http_request, sample_value};
use tokio::time::Instant;

use crate::cluster::{Role, TOKEN, start_coordinator};
use crate::process::{Process, binary_path, service_command};

/// Short leases, so failovers take seconds.
pub const TTL: Duration = Duration::from_secs(2);
pub const RENEW: Duration = Duration::from_millis(400);

/// The PostgreSQL the tests use; `.ci/run` makes sure it is running.
pub fn postgres_url() -> String {
    std::env::var("CLAWGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A store process on PostgreSQL, in `schema`.
pub async fn start_pg_store(schema: &str) -> Process {
    let mut command = service_command(binary_path(Role::Store.binary()));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store", &postgres_url(), "--pg-schema", schema])
        .env("OTEL_SERVICE_NAME", Role::Store.service_name());
    Process::start(command, Role::Store.binary(), Role::Store.ready_message()).await
}

/// A lease-mode coordinator against the store at `store_url`, executing
/// through the gRPC runtime at `runtime_url`.
pub async fn lease_coordinator(store_url: &str, runtime_url: &str) -> Process {
    let (ttl, renew) = (
        format!("{}ms", TTL.as_millis()),
        format!("{}ms", RENEW.as_millis()),
    );
    start_coordinator(
        store_url,
        &[
            "--ownership",
            "lease",
            "--lease-ttl",
            &ttl,
            "--lease-renew-interval",
            &renew,
            "--runtime",
            "grpc",
            "--runtime-address",
            runtime_url,
            "--drain-timeout",
            "20s",
        ],
    )
    .await
}

/// An edge process given `coordinators` (comma-separated addresses).
pub async fn start_edge(store_url: &str, coordinators: &str) -> Process {
    let mut command = service_command(binary_path(Role::Edge.binary()));
    command
        .args(["--listen", "127.0.0.1:0"])
        .args(["--coordinator-address", coordinators])
        .args(["--store-address", store_url])
        .args(["--auth-mode", "token", "--token", TOKEN])
        .env("OTEL_SERVICE_NAME", Role::Edge.service_name());
    Process::start(command, Role::Edge.binary(), Role::Edge.ready_message()).await
}

/// Whether the coordinator at `process` reports gRPC health SERVING.
pub async fn serving(process: &Process) -> bool {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(process.url()).unwrap();
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    let request = HealthCheckRequest {
        service: "clawgate.run_coordinator.v1.RunCoordinator".into(),
    };
    HealthClient::new(channel)
        .check(request)
        .await
        .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
}

/// Polls until `process` serves; how long that took from `since`.
pub async fn until_serving(process: &Process, since: Instant, deadline: Duration) -> Duration {
    let until = Instant::now() + deadline;
    while !serving(process).await {
        assert!(
            Instant::now() < until,
            "{} never served:\n{}",
            process.name,
            process.output().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    since.elapsed()
}

/// The store's count of writes (and renewals) refused with STALE_OWNER.
pub async fn stale_owner_refusals(store: &Process) -> f64 {
    let address = store
        .logged_address("serving /metrics")
        .expect("the store's metrics");
    let text = http_request(address, "GET", "/metrics").await.unwrap().body;
    [
        "renew_leases",
        "append",
        "update_run",
        "acquire_writer",
        "release_writer",
        "create_run",
    ]
    .iter()
    .filter_map(|op| {
        sample_value(
            &text,
            "clawgate_store_stale_owner_refusals_total",
            &format!("{{operation=\"{op}\"}}"),
        )
    })
    .sum()
}

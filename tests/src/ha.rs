//! Pieces of the multi-process high-availability tests: a store on
//! PostgreSQL, lease-mode coordinators, an edge that knows several
//! coordinators, gRPC health, and the store's STALE_OWNER count.

use std::time::Duration;

use clawgate_telemetry::metrics::{http_request, sample_value};
use tokio::time::Instant;

use crate::EdgeClient;
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
    start_pg_store_with(schema, &[]).await
}

/// `start_pg_store` with more arguments (`--partitions 32`, say).
pub async fn start_pg_store_with(schema: &str, args: &[&str]) -> Process {
    let mut command = service_command(binary_path(Role::Store.binary()));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store", &postgres_url(), "--pg-schema", schema])
        .args(args)
        .env("OTEL_SERVICE_NAME", Role::Store.service_name());
    Process::start(command, Role::Store.binary(), Role::Store.ready_message()).await
}

/// The flags of a lease-mode coordinator (the TTL and renew interval
/// above) executing through the gRPC runtime at `runtime_url`, draining for
/// up to `drain`.
pub fn lease_args(runtime_url: &str, drain: &str) -> Vec<String> {
    let (ttl, renew) = (
        format!("{}ms", TTL.as_millis()),
        format!("{}ms", RENEW.as_millis()),
    );
    [
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
        drain,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A lease-mode coordinator against the store at `store_url`, executing
/// through the gRPC runtime at `runtime_url`.
pub async fn lease_coordinator(store_url: &str, runtime_url: &str) -> Process {
    let args = lease_args(runtime_url, "20s");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_coordinator(store_url, &args).await
}

/// The logs of `processes`, each under its name, for a failing test's
/// message.
pub fn logs<'a>(processes: impl IntoIterator<Item = (String, &'a Process)>) -> String {
    let mut out = String::new();
    for (name, process) in processes {
        out.push_str(&format!(
            "==== {name} ====\n{}\n",
            process.output().join("\n")
        ));
    }
    out
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
        "start_run",
        "finish_run",
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

/// One attempt at a chat run through the edge: sends `chat.send` (the key
/// is `run_id`, so a retry is idempotent) and, once accepted, waits for the
/// run's end. `Some(state)`: how it ended (the chat state; a retry may find
/// it already over, and the answer then says so). `None`: not accepted yet.
pub async fn chat_run(client: &mut EdgeClient, session: &str, run_id: &str) -> Option<String> {
    let params = serde_json::json!({
        "sessionKey": session, "message": format!("turn {run_id}"), "idempotencyKey": run_id,
    });
    let res = client.request("chat.send", params).await;
    match (res["ok"].as_bool(), res["payload"]["status"].as_str()) {
        (Some(true), Some("ok")) => Some("final".to_owned()),
        (Some(true), _) => {
            let end = client.chat_end(run_id).await;
            Some(end["payload"]["state"].as_str().unwrap_or("?").to_owned())
        }
        (Some(false), Some("error")) => Some("error".to_owned()),
        _ => None,
    }
}

/// Waits until every count `counts` reports grew by `more`; panics with
/// `output()` after `deadline`.
pub async fn until_progress(
    counts: impl Fn() -> Vec<usize>,
    more: usize,
    deadline: Duration,
    output: impl Fn() -> String,
) {
    let start = counts();
    let until = Instant::now() + deadline;
    loop {
        let now = counts();
        if now.iter().zip(&start).all(|(n, s)| *n >= s + more) {
            return;
        }
        assert!(
            Instant::now() < until,
            "clients stalled at {now:?}:\n{}",
            output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

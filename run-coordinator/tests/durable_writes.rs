//! A run costs three durable commits in the store: admission (CreateRun,
//! before the ACK), start (StartRun: running + writer fence + user turn) and
//! finish (FinishRun: assistant turn + terminal record + release). Counted
//! from the store server's own operation metrics, on both backends.

mod common;

use clawgate_telemetry::metrics::{encode, sample_value};
use common::*;
use prometheus_client::registry::Registry;
use run_coordinator::config::CoordinatorConfig;
use session_store::model::RunStatus;

/// Every write the store serves, by its operation label.
const WRITES: [&str; 7] = [
    "create_run",
    "update_run",
    "acquire_writer",
    "append",
    "release_writer",
    "start_run",
    "finish_run",
];

fn served(registry: &Registry, operation: &str) -> u64 {
    let text = encode(registry).unwrap();
    ["ok", "error"]
        .iter()
        .map(|outcome| {
            let labels = format!("{{operation=\"{operation}\",outcome=\"{outcome}\"}}");
            sample_value(
                &text,
                "clawgate_store_operation_duration_seconds_count",
                &labels,
            )
            .unwrap_or(0.0) as u64
        })
        .sum()
}

async fn three_commits_per_run(backend: Backend) {
    let runtime = Recording::echo(1, 3);
    let cluster = Sandbox::start_on(backend, runtime, CoordinatorConfig::default()).await;
    let mut registry = Registry::default();
    cluster.store_metrics.register(&mut registry);
    let mut client = cluster.client();
    let before: Vec<u64> = WRITES.iter().map(|op| served(&registry, op)).collect();

    // Two sessions, and a second turn on one of them (it has history).
    let runs = [("w-1", "one"), ("w-2", "two"), ("w-3", "one")];
    for (run, session) in runs {
        submit(&mut client, submit_req(run, session, "hello")).await;
        let snapshot = finished(&mut client, run).await;
        assert_eq!(status(&snapshot), RunStatus::Ok, "{snapshot:?}");
    }

    let after: Vec<u64> = WRITES.iter().map(|op| served(&registry, op)).collect();
    let delta: Vec<(&str, u64)> = WRITES
        .iter()
        .zip(after.iter().zip(&before))
        .map(|(op, (a, b))| (*op, a - b))
        .filter(|(_, n)| *n > 0)
        .collect();
    let n = runs.len() as u64;
    assert_eq!(
        delta,
        [("create_run", n), ("start_run", n), ("finish_run", n)],
        "the durable writes of {n} runs"
    );
    // Nothing was lost by folding: each turn is in the transcript.
    let entries = transcript(&cluster, "one").await;
    assert_eq!(entries.len(), 4, "two turns of two entries: {entries:?}");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_three_commits_embedded() {
    three_commits_per_run(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_three_commits_postgres() {
    three_commits_per_run(Backend::Postgres).await;
}

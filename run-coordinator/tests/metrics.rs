//! The coordinator's metrics follow admission, the lanes and the terminal
//! path (read from its registry; the HTTP endpoint is covered by the
//! telemetry crate and the edge's end-to-end test).

mod common;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_telemetry::metrics::{encode, sample_value};
use common::*;
use prometheus_client::registry::Registry;
use run_coordinator::config::CoordinatorConfig;

fn value(registry: &Registry, name: &str, labels: &str) -> f64 {
    let text = encode(registry).unwrap();
    let name = format!("clawgate_coordinator_{name}");
    sample_value(&text, &name, labels).unwrap_or_else(|| panic!("no {name}{labels} in\n{text}"))
}

fn admissions(registry: &Registry, outcome: &str, reason: &str) -> f64 {
    let labels = format!("{{outcome=\"{outcome}\",reason=\"{reason}\"}}");
    value(registry, "admissions_total", &labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_lanes_and_terminals_are_counted() {
    // Runs that only end when cancelled, one at a time: the second waits.
    let runtime = Recording::echo(3_600_000, 2);
    let config = CoordinatorConfig {
        max_executing: 1,
        ..CoordinatorConfig::default()
    };
    let cluster = Sandbox::start(runtime, config).await;
    let mut registry = Registry::default();
    cluster.coordinator().register_metrics(&mut registry);
    let mut client = cluster.client();
    assert_eq!(admissions(&registry, "accepted", "new"), 0.0);

    for (run, session) in [("m-1", "one"), ("m-2", "two")] {
        let answer = submit(&mut client, submit_req(run, session, "hello")).await;
        assert_eq!(answer.admission, pb::Admission::Accepted as i32);
    }
    // Lanes are settled before the ACK: one executes, one waits for the cap.
    assert_eq!(value(&registry, "runs_executing", ""), 1.0);
    assert_eq!(value(&registry, "runs_queued", ""), 1.0);

    let again = submit(&mut client, submit_req("m-1", "one", "hello")).await;
    assert_eq!(again.admission, pb::Admission::InFlight as i32);
    let reused = client.submit(submit_req("m-1", "one", "other")).await;
    assert!(reused.is_err());

    assert_eq!(admissions(&registry, "accepted", "new"), 2.0);
    assert_eq!(admissions(&registry, "deduplicated", "in_flight"), 1.0);
    assert_eq!(admissions(&registry, "rejected", "KEY_REUSED"), 1.0);
    assert_eq!(value(&registry, "ack_duration_seconds_count", ""), 2.0);

    for run in ["m-1", "m-2"] {
        cancel_run(&mut client, run).await;
        finished(&mut client, run).await;
    }
    let ended = |status: &str| {
        value(
            &registry,
            "runs_finished_total",
            &format!("{{status=\"{status}\"}}"),
        )
    };
    wait_until(
        "both runs counted as aborted and the lanes empty",
        DEADLINE,
        || {
            ended("aborted") == 2.0
                && value(&registry, "runs_executing", "") == 0.0
                && value(&registry, "runs_queued", "") == 0.0
        },
    )
    .await;
    assert_eq!(ended("ok"), 0.0);
    cluster.finish().await;
}

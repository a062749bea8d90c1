//! The all-in-one `clawgate` binary exports one trace per run too: there
//! the coordinator calls its store in process, and those calls must still
//! show in the run's trace, as `store.<operation>` spans.

mod common;

use std::time::Duration;

use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::process::Process;
use clawgate_system_tests::{Client, Spans, TraceReceiver};
use serde_json::json;

const TOKEN: &str = "all-in-one-token";
const DEADLINE: Duration = Duration::from_secs(20);

/// Starts `clawgate` on port 0 everywhere, exporting to `receiver`; returns
/// once its edge is ready.
async fn start_all_in_one(receiver: &TraceReceiver, data: &std::path::Path) -> Process {
    let mut command = common::all_in_one(data, TOKEN);
    command
        .args([
            "--coordinator-echo-chunks",
            "2",
            "--coordinator-echo-pace",
            "5ms",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    common::start(command).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_in_one_traces_its_in_process_store_calls() {
    let receiver = TraceReceiver::start().await;
    let data = tempfile::tempdir().unwrap();
    let clawgate = start_all_in_one(&receiver, data.path()).await;
    let url = format!("ws://{}", clawgate.address);
    let mut client = Client::connect_with_token(&url, TOKEN, OPERATOR_SCOPES).await;

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let sent = client
        .request(
            "chat.send",
            json!({ "sessionKey": "agent:main:aio", "message": "hi", "idempotencyKey": run_id }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    client.chat_end(&run_id).await;

    let mut last = String::new();
    let found = receiver
        .wait_for(DEADLINE, |spans| match check(spans, &run_id) {
            Ok(()) => true,
            Err(why) => {
                last = why;
                false
            }
        })
        .await;
    assert!(found.is_some(), "{last}\n\n{}", receiver.dump());
}

/// The run's trace holds the edge's request, the execution and the store
/// calls made in process, all from the one `clawgate` service.
fn check(spans: &Spans, run_id: &str) -> Result<(), String> {
    let execute = spans.named("run.execute").with_attribute("run.id", run_id);
    let execute = execute.first().ok_or("no run.execute span for the run")?;
    let trace = spans.of_trace(&execute.trace_id());
    for name in [
        "chat.send",
        "run.admit",
        "store.create_run",
        "store.start_run",
        "store.finish_run",
    ] {
        if trace.named(name).is_empty() {
            return Err(format!("no {name} span in the run's trace"));
        }
    }
    let services = trace.services();
    if services.len() != 1 || !services.contains("clawgate") {
        return Err(format!("services {services:?}, not just clawgate"));
    }
    Ok(())
}

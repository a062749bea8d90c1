//! Acceptance tests of distributed tracing across the three processes,
//! which export to an in-process OTLP receiver. The span contract is in
//! `clawgate_system_tests::contract`; these tests produce the traffic and
//! wait until the received spans satisfy it.

use std::time::Duration;

use clawgate_system_tests::contract::{self, ChatRun};
use clawgate_system_tests::{Client, Spans, System, TraceReceiver};
use serde_json::{Map, Value, json};

/// How long spans may take to arrive (exports are batched every 100 ms).
const SPANS_TIMEOUT: Duration = Duration::from_secs(20);

/// The echo runtime streams a message of at least this many characters in
/// this many pieces, `ECHO_PACE` apart; a shorter one in one piece per
/// character.
const ECHO_CHUNKS: usize = 40;
const ECHO_PACE: Duration = Duration::from_millis(100);

const SESSION: &str = "agent:main:tracing";

/// A receiver, a cluster exporting its spans to it, and a connected client.
async fn traced_cluster() -> (TraceReceiver, System, Client) {
    let receiver = TraceReceiver::start().await;
    let cluster = System::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .echo(ECHO_CHUNKS, ECHO_PACE)
        .start()
        .await;
    let client = cluster.connect().await;
    (receiver, cluster, client)
}

/// 32 random hex digits.
fn random_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(members) => members,
        other => panic!("not a JSON object: {other}"),
    }
}

/// Sends `chat.send` on `SESSION`, with the members of `extra` added to the
/// params and those of `frame` to the request frame, and checks it was
/// accepted; returns the run id.
async fn chat_send(client: &mut Client, message: &str, extra: Value, frame: Value) -> String {
    let run_id = random_hex();
    let mut params = object(json!({
        "sessionKey": SESSION, "message": message, "idempotencyKey": run_id,
    }));
    params.extend(object(extra));
    let id = client
        .send_request("chat.send", Value::Object(params), object(frame))
        .await;
    let res = client.response(&id).await;
    assert_eq!(res["ok"], true, "chat.send failed: {res}");
    assert_eq!(res["payload"]["runId"], run_id.as_str(), "{res}");
    run_id
}

/// Waits until `check` accepts the received spans and returns what it
/// found; at the deadline, panics with its last complaint, every span
/// received and the processes' output.
async fn await_spans<T>(
    receiver: &TraceReceiver,
    cluster: &System,
    mut check: impl FnMut(&Spans) -> Result<T, String>,
) -> T {
    let mut last = Err("no spans were checked".to_owned());
    receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            last = check(spans);
            last.is_ok()
        })
        .await;
    last.unwrap_or_else(|why| {
        panic!(
            "{why}\n\nspans received:\n{}\nprocess output:\n{}",
            receiver.dump(),
            cluster.output()
        )
    })
}

/// Acceptance 1: a chat run is one trace across edge, coordinator and
/// store; a run that supersedes it links to the run it replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_run_is_one_trace_across_the_services_and_a_superseding_run_links_back() {
    let (receiver, cluster, mut client) = traced_cluster().await;
    let ok_run = |run_id| ChatRun {
        run_id,
        session_key: SESSION,
        status: "ok",
    };

    let first = chat_send(&mut client, "first", json!({}), json!({})).await;
    let end = client.chat_end(&first).await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    await_spans(&receiver, &cluster, |spans| {
        contract::chat_run_trace(spans, ok_run(&first))
    })
    .await;

    // A message of ECHO_CHUNKS characters streams for ECHO_CHUNKS * ECHO_PACE
    // (4 s): once it started, an interrupt finds it running.
    let long = "x".repeat(ECHO_CHUNKS);
    let old = chat_send(&mut client, &long, json!({}), json!({})).await;
    client.run_started(&old).await;
    let new = chat_send(
        &mut client,
        "interrupt",
        json!({ "queueMode": "interrupt" }),
        json!({}),
    )
    .await;
    let old_end = client.chat_end(&old).await;
    assert_eq!(old_end["payload"]["stopReason"], "superseded", "{old_end}");
    let new_end = client.chat_end(&new).await;
    assert_eq!(new_end["payload"]["state"], "final", "{new_end}");

    await_spans(&receiver, &cluster, |spans| {
        contract::chat_run_trace(spans, ok_run(&new))?;
        contract::supersede_link(spans, &old, &new)
    })
    .await;
}

/// Acceptance 2: a request frame's `traceparent` is the parent of the
/// edge's span for it, and the trace goes on into the coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_frame_traceparent_is_the_parent_of_the_edge_span() {
    let (receiver, cluster, mut client) = traced_cluster().await;

    let trace_id = random_hex();
    let parent_id = random_hex()[..16].to_owned();
    let traceparent = format!("00-{trace_id}-{parent_id}-01");
    let run_id = chat_send(
        &mut client,
        "traced",
        json!({}),
        json!({ "traceparent": traceparent }),
    )
    .await;
    client.chat_end(&run_id).await;

    await_spans(&receiver, &cluster, |spans| {
        contract::continues_caller_trace(spans, &run_id, &trace_id, &parent_id)
    })
    .await;
}

/// A wait, a resume and a cancel acting on a run link to the run's
/// execution, so the trace of each request leads to the run it observed or
/// stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_resumes_and_cancels_link_to_the_run_they_act_on() {
    let (receiver, cluster, mut client) = traced_cluster().await;

    let long = "x".repeat(ECHO_CHUNKS);
    let run_id = chat_send(&mut client, &long, json!({}), json!({})).await;
    client.run_started(&run_id).await;
    let waited = client
        .request("agent.wait", json!({ "runId": run_id, "timeoutMs": 50 }))
        .await;
    assert_eq!(waited["ok"], true, "{waited}");
    let resumed = client
        .request("runs.resume", json!({ "runId": run_id }))
        .await;
    assert_eq!(resumed["ok"], true, "{resumed}");
    let aborted = client
        .request(
            "chat.abort",
            json!({ "sessionKey": SESSION, "runId": run_id }),
        )
        .await;
    assert_eq!(aborted["payload"]["aborted"], true, "{aborted}");
    client.chat_end(&run_id).await;

    await_spans(&receiver, &cluster, |spans| {
        contract::links_to_run(spans, contract::WAIT, &run_id)?;
        contract::links_to_run(spans, contract::SUBSCRIBE, &run_id)?;
        contract::links_to_run(spans, contract::CANCEL, &run_id)
    })
    .await;
}

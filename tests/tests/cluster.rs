//! The harness against today's binaries: a chat run goes through edge,
//! coordinator and store running as separate processes, and the trace
//! receiver the services can export to is up.

use clawgate_system_tests::{System, TraceReceiver};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_run_crosses_all_three_processes() {
    let receiver = TraceReceiver::start().await;
    let cluster = System::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start()
        .await;
    let mut client = cluster.connect().await;
    let methods = &client.hello()["features"]["methods"];
    assert!(
        methods
            .as_array()
            .is_some_and(|m| m.contains(&json!("chat.send"))),
        "chat.send is not advertised: {methods}"
    );

    let run_id = uuid::Uuid::new_v4().to_string();
    let res = client
        .request(
            "chat.send",
            json!({ "sessionKey": "main", "message": "hello system", "idempotencyKey": run_id }),
        )
        .await;
    assert_eq!(
        res["ok"],
        true,
        "chat.send failed: {res}\n{}",
        cluster.output()
    );
    assert_eq!(res["payload"]["runId"], run_id.as_str());

    let end = client.chat_end(&run_id).await;
    assert_eq!(
        end["payload"]["state"],
        "final",
        "{end}\n{}",
        cluster.output()
    );
    assert_eq!(
        end["payload"]["message"]["content"][0]["text"],
        "hello system"
    );

    // The coordinator settled the run: `agent.wait` sees it as ok.
    let waited = client
        .request(
            "agent.wait",
            json!({ "runId": run_id, "timeoutMs": 10_000 }),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");

    // The store kept the turn: the history holds the user message and the reply.
    let history = client
        .request("chat.history", json!({ "sessionKey": "main" }))
        .await;
    let messages = history["payload"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no history: {history}"));
    assert!(messages.len() >= 2, "{history}");

    // The receiver the services were pointed at is up; whether spans
    // arrive depends on the services' tracing, which the trace tests check.
    let reachable = tokio::net::TcpStream::connect(receiver.address()).await;
    assert!(reachable.is_ok(), "the trace receiver is not reachable");
}

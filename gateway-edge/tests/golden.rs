//! Golden replay: the client frames of real OpenClaw captures are sent to a
//! real edge (in front of a real coordinator and store); the answers must
//! have the same shapes, statuses, error codes and close codes as the real
//! gateway's (ids, times, texts of model output and method lists aside).

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::Value;

/// One recorded connection: its lines in order.
fn connections(file: &str) -> BTreeMap<u64, Vec<Value>> {
    let mut conns: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    for record in captures::records(file) {
        conns
            .entry(record["conn"].as_u64().unwrap())
            .or_default()
            .push(record);
    }
    conns
}

/// Payload members that carry the contract (compared when the real
/// gateway sent them).
const CONTRACT_KEYS: &[&str] = &[
    "runId",
    "status",
    "ok",
    "aborted",
    "runIds",
    "error",
    "stopReason",
    "summary",
    "type",
    "protocol",
    "subscribed",
    "deleted",
];

fn compare_res(file: &str, expected: &Value, actual: &Value) {
    let at = format!("{file}: res {}", expected["id"]);
    assert_eq!(
        actual["ok"], expected["ok"],
        "{at}: ok differs\nexpected {expected}\nactual   {actual}"
    );
    if let Some(error) = expected.get("error") {
        assert_eq!(
            actual["error"]["code"], error["code"],
            "{at}: error code\n{actual}"
        );
        assert_eq!(
            actual["error"]["message"], error["message"],
            "{at}: error message\n{actual}"
        );
        if let Some(code) = error["details"].get("code") {
            assert_eq!(
                &actual["error"]["details"]["code"], code,
                "{at}: details.code\n{actual}"
            );
        }
    }
    if let Some(payload) = expected.get("payload").and_then(Value::as_object) {
        let ours = actual["payload"]
            .as_object()
            .unwrap_or_else(|| panic!("{at}: no payload object: {actual}"));
        for key in CONTRACT_KEYS {
            if let Some(value) = payload.get(*key) {
                assert_eq!(
                    ours.get(*key),
                    Some(value),
                    "{at}: payload.{key}\nexpected {expected}\nactual   {actual}"
                );
            }
        }
        if payload.get("type") == Some(&Value::from("hello-ok")) {
            for key in ["server", "features", "snapshot", "auth", "policy"] {
                assert!(ours.contains_key(key), "{at}: hello-ok lacks {key}");
            }
            assert_eq!(
                ours["auth"]["scopes"], payload["auth"]["scopes"],
                "{at}: granted scopes"
            );
            assert_eq!(
                ours["auth"]["method"], payload["auth"]["method"],
                "{at}: auth method"
            );
        }
        if payload.contains_key("messages") {
            assert!(ours["messages"].is_array(), "{at}: messages");
        }
    }
}

/// The terminal chat state the recorded client waited for, if any.
fn awaited_chat_end(records: &[Value]) -> Option<(String, String)> {
    records.iter().rev().find_map(|r| {
        let frame = &r["json"];
        let state = frame["payload"]["state"].as_str()?;
        (r["dir"] == "s2c" && frame["event"] == "chat" && state != "delta").then(|| {
            (
                frame["payload"]["runId"].as_str().unwrap().to_owned(),
                state.to_owned(),
            )
        })
    })
}

async fn replay(file: &str) {
    let system = System::start().await;
    let (url, _) = system.edge(system.edge_config()).await;
    for (conn, records) in connections(file) {
        let mut client = Client::open(&url).await;
        let challenge = client.next_frame().await.expect("challenge");
        assert_eq!(challenge["event"], "connect.challenge");
        assert!(challenge.get("seq").is_none());
        // Requests of this connection, sent in order; responses collected by id.
        let requests: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == "frame" && r["dir"] == "c2s")
            .map(|r| &r["json"])
            .collect();
        let server_closed_first = records
            .iter()
            .find(|r| r["kind"] == "close")
            .is_some_and(|r| r["side"] == "server");
        let mut pending: Vec<(String, Vec<&Value>)> = Vec::new();
        for request in &requests {
            client.send(request).await;
            let id = request["id"].as_str().unwrap().to_owned();
            let expected: Vec<&Value> = records
                .iter()
                .filter(|r| {
                    r["dir"] == "s2c"
                        && r["json"]["type"] == "res"
                        && r["json"]["id"] == id.as_str()
                })
                .map(|r| &r["json"])
                .collect();
            pending.push((id, expected));
        }
        for (id, expected) in &pending {
            for (index, expected_res) in expected.iter().enumerate() {
                let actual = loop {
                    let got: Vec<&Value> = client
                        .received
                        .iter()
                        .filter(|f| f["type"] == "res" && f["id"] == id.as_str())
                        .collect();
                    if let Some(actual) = got.get(index) {
                        break (*actual).clone();
                    }
                    if client.next_frame().await.is_none() {
                        panic!(
                            "{file} conn {conn}: closed before res {id} #{index}: {:?}",
                            client.closed
                        );
                    }
                };
                compare_res(file, expected_res, &actual);
            }
        }
        if server_closed_first {
            let close = records.iter().find(|r| r["kind"] == "close").unwrap();
            let (code, reason) = client.until_closed().await;
            assert_eq!(
                u64::from(code),
                close["code"].as_u64().unwrap(),
                "{file} conn {conn}: close code"
            );
            assert_eq!(
                reason,
                close["reason"].as_str().unwrap(),
                "{file} conn {conn}: close reason"
            );
            continue;
        }
        if let Some((run_id, state)) = awaited_chat_end(&records) {
            client
                .event(|f| {
                    f["event"] == "chat"
                        && f["payload"]["runId"] == run_id.as_str()
                        && f["payload"]["state"] == state.as_str()
                })
                .await;
        }
        // Broadcast events carry a per-connection seq from 1, without gaps here.
        let seqs: Vec<u64> = client
            .received
            .iter()
            .filter_map(|f| f["seq"].as_u64())
            .collect();
        assert!(
            seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1),
            "{file} conn {conn}: seqs {seqs:?}"
        );
        let _ = client.ws.close(None).await;
    }
    system.stop.cancel();
}

macro_rules! golden {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                replay($file).await;
            }
        )*
    };
}

golden! {
    capture_01_handshake_health => "01-handshake-health.jsonl",
    capture_03_agent_expect_final => "03-agent-expect-final.jsonl",
    capture_05_agent_wait => "05-agent-wait.jsonl",
    capture_06_chat_send => "06-chat-send.jsonl",
    capture_08_chat_abort => "08-chat-abort.jsonl",
    capture_09_errors => "09-errors.jsonl",
    capture_10_health_command => "10-health-command.jsonl",
    capture_12_status_probe_commands => "12-status-probe-commands.jsonl",
}

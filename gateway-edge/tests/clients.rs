//! What current OpenClaw clients send, end to end through a real edge,
//! coordinator and store: the Control UI's and the Linux app's `connect`,
//! node hosts refused at `connect`, the four queue modes of `chat.send`,
//! `agent.wait` on a queued run, and the slash commands.

mod common;

use common::*;
use serde_json::{Value, json};

const ADMIN_SCOPES: &[&str] = &["operator.admin", "operator.read", "operator.write"];

/// The Control UI's connect (clients-v4.md §3.2), as it sends it.
fn control_ui_connect() -> Value {
    let mut params = connect_params(&["operator.admin", "operator.read", "operator.write"]);
    params["client"] = json!({
        "id": "openclaw-control-ui", "version": "2026.9.6",
        "buildId": "2026.9.6-release-eb377ac59e6c-2026-09-23T16-33-12.144Z",
        "platform": "Linux x86_64", "mode": "webchat",
        "instanceId": "2e1e0b7b-68de-4471-ad08-8a313e82e936", "timeZone": "UTC",
    });
    params["modelCatalog"] = json!({ "sessionKey": "main" });
    params["caps"] = json!(["tool-events", "agent-kind"]);
    params["locale"] = json!("en-US");
    params["userAgent"] = json!("Mozilla/5.0");
    params
}

async fn connect_with(url: &str, params: Value) -> (Client, Value) {
    let mut client = Client::open(url).await;
    client.next_frame().await.expect("challenge");
    client
        .send(&json!({"type":"req","id":"c-1","method":"connect","params":params}))
        .await;
    let res = client.response("c-1").await;
    (client, res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_clients_connect_and_node_hosts_are_told_why_not() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;

    let (_ui, res) = connect_with(&url, control_ui_connect()).await;
    assert_eq!(res["ok"], true, "{res}");
    let hello = &res["payload"];
    assert!(hello["server"]["bootId"].is_string(), "{hello}");
    let methods = hello["features"]["methods"].as_array().unwrap();
    for method in [
        "chat.startup",
        "chat.metadata",
        "sessions.create",
        "sessions.patch",
        "models.list",
    ] {
        assert!(
            methods.iter().any(|m| m == method),
            "{method} not advertised"
        );
    }
    // The presence snapshot lists the gateway and this connection.
    let presence = hello["snapshot"]["presence"].as_array().unwrap();
    assert_eq!(presence[0]["mode"], "gateway");
    assert!(
        presence
            .iter()
            .any(|p| p["clientId"] == "openclaw-control-ui"),
        "{presence:?}"
    );

    let mut linux = control_ui_connect();
    linux["client"]["id"] = json!("openclaw-linux");
    linux["client"]["mode"] = json!("ui");
    let (_app, res) = connect_with(&url, linux).await;
    assert_eq!(res["ok"], true, "{res}");

    // The schema stays closed, and its bounds hold.
    let mut too_long = control_ui_connect();
    too_long["client"]["timeZone"] = json!("x".repeat(65));
    let (mut refused, res) = connect_with(&url, too_long).await;
    assert_eq!(res["error"]["code"], "INVALID_REQUEST", "{res}");
    assert_eq!(refused.until_closed().await.0, 1008);
    let mut unknown = control_ui_connect();
    unknown["client"]["favoriteColor"] = json!("teal");
    let (_refused, res) = connect_with(&url, unknown).await;
    assert!(
        res["error"]["message"]
            .as_str()
            .unwrap()
            .contains("additional properties (favoriteColor)"),
        "{res}"
    );

    // A node host learns at connect that nodes are not served here.
    let mut node = connect_params(&[]);
    node["role"] = json!("node");
    node["client"] =
        json!({ "id": "node-host", "version": "2026.9.6", "platform": "linux", "mode": "node" });
    let (mut node, res) = connect_with(&url, node).await;
    assert_eq!(res["ok"], false);
    assert_eq!(
        res["error"]["details"]["code"], "NODE_ROLE_UNSUPPORTED",
        "{res}"
    );
    assert_eq!(node.until_closed().await.0, 1008);
    system.stop.cancel();
}

/// Sends `message` to `session`; the ack.
async fn send(
    client: &mut Client,
    session: &str,
    run_id: &str,
    message: &str,
    extra: Value,
) -> Value {
    let mut params = json!({ "sessionKey": session, "message": message, "idempotencyKey": run_id });
    for (key, value) in extra.as_object().unwrap() {
        params[key] = value.clone();
    }
    client.request("chat.send", params).await
}

async fn chat_end(client: &mut Client, run_id: &str) -> Value {
    client
        .event(|f| {
            f["event"] == "chat"
                && f["payload"]["runId"] == run_id
                && f["payload"]["state"] != "delta"
        })
        .await
}

async fn run_started(client: &mut Client, run_id: &str) {
    client
        .event(|f| {
            f["event"] == "agent"
                && f["payload"]["runId"] == run_id
                && f["payload"]["data"]["phase"] == "start"
        })
        .await;
}

/// The texts of a session's history said by `role`.
async fn texts_of(client: &mut Client, session: &str, role: &str) -> Vec<String> {
    history(client, session)
        .await
        .into_iter()
        .filter(|(said_by, _)| said_by == role)
        .map(|(_, text)| text)
        .collect()
}

/// `(role, text)` of a session's history.
async fn history(client: &mut Client, session: &str) -> Vec<(String, String)> {
    let res = client
        .request("chat.history", json!({ "sessionKey": session }))
        .await;
    res["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = m["content"]
                .as_array()
                .map(|parts| parts.iter().filter_map(|p| p["text"].as_str()).collect())
                .unwrap_or_default();
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_queue_modes_of_chat_send() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.write"]).await;

    // steer (the default): into the running turn.
    send(&mut client, "qm-steer", "st-1", "SLOW story", json!({})).await;
    run_started(&mut client, "st-1").await;
    let ack = send(&mut client, "qm-steer", "st-2", "shorter", json!({})).await;
    assert_eq!(ack["payload"]["status"], "started", "{ack}");
    let end = chat_end(&mut client, "st-1").await;
    assert_eq!(end["payload"]["state"], "final");
    assert_eq!(
        chat_end(&mut client, "st-2").await["payload"]["state"],
        "final"
    );
    assert_eq!(
        history(&mut client, "qm-steer").await,
        pairs(&[
            ("user", "SLOW story"),
            ("assistant", "SLOW story"),
            ("user", "shorter"),
            ("assistant", "shorter")
        ])
    );

    // followup: a turn of its own.
    send(&mut client, "qm-follow", "fu-1", "SLOW first", json!({})).await;
    run_started(&mut client, "fu-1").await;
    send(
        &mut client,
        "qm-follow",
        "fu-2",
        "second",
        json!({ "queueMode": "followup" }),
    )
    .await;
    // Queued behind the running turn: agent.wait answers at once.
    let waited = client
        .request(
            "agent.wait",
            json!({ "runId": "fu-2", "timeoutMs": 60_000 }),
        )
        .await;
    assert_eq!(
        waited["payload"],
        json!({ "runId": "fu-2", "status": "pending", "timeoutPhase": "queue", "providerStarted": false })
    );
    chat_end(&mut client, "fu-2").await;
    assert_eq!(
        history(&mut client, "qm-follow").await,
        pairs(&[
            ("user", "SLOW first"),
            ("assistant", "SLOW first"),
            ("user", "second"),
            ("assistant", "second")
        ])
    );

    // collect: the messages waiting together are one turn.
    send(&mut client, "qm-collect", "co-0", "SLOW busy", json!({})).await;
    run_started(&mut client, "co-0").await;
    for (id, text) in [("co-1", "one"), ("co-2", "two")] {
        send(
            &mut client,
            "qm-collect",
            id,
            text,
            json!({ "queueMode": "collect" }),
        )
        .await;
    }
    chat_end(&mut client, "co-2").await;
    assert_eq!(
        history(&mut client, "qm-collect").await,
        pairs(&[
            ("user", "SLOW busy"),
            ("assistant", "SLOW busy"),
            ("user", "one"),
            ("user", "two"),
            ("assistant", "one\n\ntwo"),
        ])
    );

    // interrupt: supersedes the running turn.
    send(&mut client, "qm-int", "in-1", "SLOW long", json!({})).await;
    run_started(&mut client, "in-1").await;
    send(
        &mut client,
        "qm-int",
        "in-2",
        "instead",
        json!({ "queueMode": "interrupt" }),
    )
    .await;
    assert_eq!(
        chat_end(&mut client, "in-2").await["payload"]["state"],
        "final"
    );
    assert_eq!(
        texts_of(&mut client, "qm-int", "user").await,
        ["SLOW long", "instead"]
    );

    let bad = send(
        &mut client,
        "qm-bad",
        "bad-1",
        "hi",
        json!({ "queueMode": "eventually" }),
    )
    .await;
    assert_eq!(
        bad["error"]["message"],
        "invalid chat.send params: /queueMode must be equal to one of the allowed values"
    );
    system.stop.cancel();
}

/// A send that names no queue mode gets the session's, as the store has it
/// at admission: also when another writer (another edge; here a store
/// client) changed it after this edge last read the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_uses_settings_changed_behind_the_edge() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.read", "operator.write"]).await;
    // The first send reads the session (creating it); the edge keeps its
    // settings.
    send(&mut client, "behind", "bh-0", "hello", json!({})).await;
    chat_end(&mut client, "bh-0").await;

    interrupt_behind_the_edge(&system, "behind", false).await;

    // Interrupt, not followup.
    assert_a_send_interrupts(&mut client, "behind", "bh").await;
    assert_eq!(
        texts_of(&mut client, "behind", "assistant").await,
        ["hello", "instead"]
    );
    system.stop.cancel();
}

/// Sets `session`'s queue mode to `interrupt` straight in the store (as
/// another edge would), creating the session when `create`.
async fn interrupt_behind_the_edge(system: &Sandbox, session: &str, create: bool) {
    use session_store_api::SessionStore;
    let store = session_store_api::grpc::client::RemoteStore::connect(system.store_url())
        .await
        .unwrap();
    store
        .patch_session(session_store_api::model::PatchSession {
            key: session_store_api::SessionKey::parse(session).unwrap(),
            patch_json: json!({ "queueMode": "interrupt" }).to_string(),
            create,
        })
        .await
        .unwrap();
}

/// A send while a slow run of `session` executes supersedes it (runIds
/// `{prefix}-1`, `{prefix}-2`): the session's queue mode is `interrupt`.
async fn assert_a_send_interrupts(client: &mut Client, session: &str, prefix: &str) {
    let (slow, instead) = (format!("{prefix}-1"), format!("{prefix}-2"));
    send(client, session, &slow, "SLOW long", json!({})).await;
    run_started(client, &slow).await;
    let ack = send(client, session, &instead, "instead", json!({})).await;
    assert_eq!(ack["payload"]["status"], "started", "{ack}");
    assert_eq!(chat_end(client, &slow).await["payload"]["state"], "aborted");
    assert_eq!(
        chat_end(client, &instead).await["payload"]["state"],
        "final"
    );
}

/// A session this edge has never seen is first taken for a new one (empty
/// settings, created by the admission's write); one that exists with
/// settings of its own refuses that admission, and the send is made again
/// from the settings read from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_to_a_session_with_settings_uses_them() {
    let system = system().await;
    interrupt_behind_the_edge(&system, "preset", true).await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.read", "operator.write"]).await;

    // Interrupt, the session's own mode.
    assert_a_send_interrupts(&mut client, "preset", "ps").await;
    let described = client
        .request("sessions.describe", json!({ "key": "preset" }))
        .await;
    assert_eq!(
        described["payload"]["session"]["queueMode"], "interrupt",
        "{described}"
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_commands_are_interpreted_with_their_scopes() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut writer = Client::connect(&url, &["operator.write"]).await;
    let mut admin = Client::connect(&url, ADMIN_SCOPES).await;

    // /queue sets the session's mode.
    let set = send(&mut writer, "cmd", "q-1", "/queue followup", json!({})).await;
    assert_eq!(set["payload"]["queueMode"], "followup", "{set}");
    let described = writer
        .request("sessions.describe", json!({ "key": "cmd" }))
        .await;
    assert_eq!(
        described["payload"]["session"]["queueMode"], "followup",
        "{described}"
    );

    // /stop aborts the session's run.
    send(&mut writer, "cmd", "s-1", "SLOW going on", json!({})).await;
    run_started(&mut writer, "s-1").await;
    let stopped = send(&mut writer, "cmd", "s-2", "/stop", json!({})).await;
    assert_eq!(stopped["payload"]["aborted"], true, "{stopped}");
    assert_eq!(
        chat_end(&mut writer, "s-1").await["payload"]["state"],
        "aborted"
    );

    // /reset needs admin; then the transcript starts afresh.
    let refused = send(&mut writer, "cmd", "r-1", "/reset", json!({})).await;
    assert_eq!(
        refused["error"]["message"], "missing scope: operator.admin",
        "{refused}"
    );
    admin.request("sessions.subscribe", json!({})).await;
    let reset = send(&mut admin, "cmd", "r-2", "/reset", json!({})).await;
    assert_eq!(reset["ok"], true, "{reset}");
    let changed = admin
        .event(|f| f["event"] == "sessions.changed" && f["payload"]["reason"] == "reset")
        .await;
    assert_eq!(changed["payload"]["sessionKey"], "agent:main:cmd");
    let after: Vec<(String, String)> = history(&mut admin, "cmd")
        .await
        .into_iter()
        .filter(|(role, _)| role != "system")
        .collect();
    assert!(after.is_empty(), "{after:?}");

    // Not interpreted when the send says so: the model gets the text.
    send(
        &mut writer,
        "cmd",
        "t-1",
        "/stop",
        json!({ "suppressCommandInterpretation": true }),
    )
    .await;
    let end = chat_end(&mut writer, "t-1").await;
    assert_eq!(end["payload"]["state"], "final");
    assert_eq!(end["payload"]["message"]["content"][0]["text"], "/stop");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_agent_for_a_running_key_answers_in_flight_once() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.write"]).await;
    let params = json!({ "message": "SLOW work", "idempotencyKey": "dup-1", "sessionKey": "dup" });
    client
        .send(&json!({"type":"req","id":"first","method":"agent","params":params}))
        .await;
    assert_eq!(
        client.response("first").await["payload"]["status"],
        "accepted"
    );
    client
        .send(&json!({"type":"req","id":"again","method":"agent","params":params}))
        .await;
    let again = client.response("again").await;
    assert_eq!(again["payload"]["status"], "in_flight", "{again}");
    assert_eq!(again["payload"]["runId"], "dup-1");
    // The original request gets the final; the duplicate nothing more.
    let last = client.response("first").await;
    assert_eq!(last["payload"]["status"], "ok", "{last}");
    chat_end(&mut client, "dup-1").await;
    let answers = client
        .received
        .iter()
        .filter(|f| f["type"] == "res" && f["id"] == "again")
        .count();
    assert_eq!(answers, 1);
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_reach_the_runtime_and_the_transcript() {
    let system = system().await;
    let mut config = system.edge_config();
    config.attachment_max_bytes = 1024;
    let (url, _) = system.edge(config).await;
    let mut client = Client::connect(&url, &["operator.write"]).await;
    // As the Control UI sends an image: base64 content, no text at all.
    let image = json!({ "type": "image", "mimeType": "image/png", "fileName": "dot.png", "content": "iVBORw0KGgo=" });
    let sent = send(
        &mut client,
        "files",
        "img-1",
        "",
        json!({ "attachments": [image] }),
    )
    .await;
    assert_eq!(sent["payload"]["status"], "started", "{sent}");
    let end = chat_end(&mut client, "img-1").await;
    // The echo runtime says what it was given.
    assert_eq!(
        end["payload"]["message"]["content"][0]["text"],
        "[dot.png: image/png, 8 bytes]"
    );
    let history = client
        .request("chat.history", json!({ "sessionKey": "files" }))
        .await;
    let user = &history["payload"]["messages"][0];
    assert_eq!(
        user["content"],
        json!([{ "type": "image", "mimeType": "image/png", "fileName": "dot.png", "data": "iVBORw0KGgo=" }])
    );
    // A data URL carries its own MIME type.
    let file =
        json!({ "type": "file", "fileName": "a.txt", "content": "data:text/plain;base64,aGk=" });
    let sent = send(
        &mut client,
        "files",
        "txt-1",
        "read this",
        json!({ "attachments": [file] }),
    )
    .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let end = chat_end(&mut client, "txt-1").await;
    assert_eq!(
        end["payload"]["message"]["content"][0]["text"],
        "read this\n[a.txt: text/plain, 2 bytes]"
    );

    let big = json!({ "mimeType": "image/png", "content": "A".repeat(2000) });
    let refused = send(
        &mut client,
        "files",
        "big-1",
        "",
        json!({ "attachments": [big] }),
    )
    .await;
    assert_eq!(
        refused["error"]["details"]["code"], "ATTACHMENTS_TOO_LARGE",
        "{refused}"
    );
    let garbled = json!({ "mimeType": "image/png", "content": "not base64!" });
    let refused = send(
        &mut client,
        "files",
        "bad-1",
        "hi",
        json!({ "attachments": [garbled] }),
    )
    .await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/attachments/0 content is not base64"),
        "{refused}"
    );
    let nothing = send(
        &mut client,
        "files",
        "none-1",
        " ",
        json!({ "attachments": [] }),
    )
    .await;
    assert_eq!(
        nothing["error"]["message"],
        "message or attachment required"
    );
    system.stop.cancel();
}

/// Tool events (`agent` stream `tool`) go only to connections that asked
/// for them with the `tool-events` cap, and as `session.tool` to those that
/// subscribed to sessions; every reader gets the rest of the run, in the
/// same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_events_reach_only_connections_with_the_tool_events_cap() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut params = connect_params(&[WRITE]);
    params["caps"] = json!(["tool-events"]);
    let (mut capped, res) = connect_with(&url, params).await;
    assert_eq!(res["ok"], true, "{res}");
    let mut plain = Client::connect(&url, &[READ]).await;
    let mut subscriber = Client::connect(&url, &[READ]).await;
    let subscribed = subscriber.request("sessions.subscribe", json!({})).await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let sent = capped
        .request(
            "chat.send",
            json!({ "sessionKey": "tools", "message": "TOOL please", "idempotencyKey": "tool-1" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let is_final = |f: &Value| {
        f["event"] == "chat"
            && f["payload"]["runId"] == "tool-1"
            && f["payload"]["state"] == "final"
    };
    capped.event(is_final).await;
    plain.event(is_final).await;
    subscriber.event(is_final).await;
    let tool_phases = |client: &Client| -> Vec<String> {
        client
            .received
            .iter()
            .filter(|f| f["event"] == "agent" && f["payload"]["stream"] == "tool")
            .map(|f| {
                f["payload"]["data"]["phase"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let phases = tool_phases(&capped);
    assert_eq!(
        phases.first().map(String::as_str),
        Some("start"),
        "{phases:?}"
    );
    assert_eq!(
        phases.last().map(String::as_str),
        Some("result"),
        "{phases:?}"
    );
    assert!(tool_phases(&plain).is_empty(), "{:?}", tool_phases(&plain));
    // The subscriber saw the same tool events as `session.tool`, and only
    // those.
    let session_tool: Vec<&Value> = subscriber
        .received
        .iter()
        .filter(|f| f["event"] == "session.tool")
        .collect();
    let capped_tool: Vec<&Value> = capped
        .received
        .iter()
        .filter(|f| f["event"] == "agent" && f["payload"]["stream"] == "tool")
        .collect();
    assert_eq!(session_tool.len(), capped_tool.len(), "{session_tool:?}");
    for (seen, tool) in session_tool.iter().zip(&capped_tool) {
        assert_eq!(seen["payload"], tool["payload"]);
        assert!(seen.get("seq").is_none(), "targeted: {seen}");
    }
    assert!(tool_phases(&subscriber).is_empty());
    assert!(
        !plain.received.iter().any(|f| f["event"] == "session.tool"),
        "only to subscribers"
    );
    // Both saw the same run otherwise: its other events, in order.
    let others = |client: &Client| -> Vec<(String, String)> {
        client
            .received
            .iter()
            .filter(|f| {
                f["type"] == "event"
                    && f["payload"]["runId"] == "tool-1"
                    && f["payload"]["stream"] != "tool"
            })
            .map(|f| {
                let kind = &f["payload"];
                (
                    f["event"].as_str().unwrap_or_default().to_owned(),
                    kind["state"]
                        .as_str()
                        .or(kind["stream"].as_str())
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(others(&capped), others(&plain));
    system.stop.cancel();
}

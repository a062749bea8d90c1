//! What logged-in clients can make the gateway hold is bounded
//! (docs/security.md): the sessions a connection watches, the runs it
//! follows through `runs.resume`, the Control UI preferences, the bytes of
//! requests being handled, and the coordinator's queue of runs not yet
//! started. Each limit is hit and answered in the protocol's shape, a
//! client within its limits keeps working, and nothing accepted is lost.

mod common;

use common::*;
use run_coordinator::config::CoordinatorConfig;
use serde_json::{Value, json};

fn assert_refused(answer: &Value, code: &str, detail: &str, setting: &str) {
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["error"]["code"], code, "{answer}");
    if !detail.is_empty() {
        assert_eq!(answer["error"]["details"]["code"], detail, "{answer}");
    }
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(setting), "{answer}");
}

async fn served(client: &mut Client) {
    let health = client.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_watches_a_bounded_set_of_sessions() {
    let system = system().await;
    let mut config = system.edge_config();
    config.max_watched_sessions = 2;
    let (url, _) = system.edge(config).await;
    let mut watcher = Client::connect(&url, &[READ]).await;
    let mut bystander = Client::connect(&url, &[READ]).await;
    let watch = |key: &str| json!({ "key": key });
    for key in ["watch-1", "watch-2", "watch-1"] {
        let ok = watcher
            .request("sessions.messages.subscribe", watch(key))
            .await;
        assert_eq!(ok["ok"], true, "{key}: {ok}");
    }
    let over = watcher
        .request("sessions.messages.subscribe", watch("watch-3"))
        .await;
    assert_refused(
        &over,
        "INVALID_REQUEST",
        "TOO_MANY_WATCHED_SESSIONS",
        "EDGE_MAX_WATCHED_SESSIONS",
    );
    let ok = bystander
        .request("sessions.messages.subscribe", watch("watch-3"))
        .await;
    assert_eq!(ok["ok"], true, "another connection has its own: {ok}");
    // One unwatched makes room.
    let off = watcher
        .request("sessions.messages.unsubscribe", watch("watch-1"))
        .await;
    assert_eq!(off["ok"], true, "{off}");
    let ok = watcher
        .request("sessions.messages.subscribe", watch("watch-3"))
        .await;
    assert_eq!(ok["ok"], true, "{ok}");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_follows_a_bounded_number_of_resumed_runs() {
    let runtime = GatedRuntime::new(1);
    let system = system_with_runtime(CoordinatorConfig::default(), runtime.clone()).await;
    let mut config = system.edge_config();
    config.max_resumes = 1;
    let (url, _) = system.edge(config).await;
    let mut sender = Client::connect(&url, &[WRITE]).await;
    for n in 1..=2 {
        let sent = sender
            .request(
                "chat.send",
                json!({ "sessionKey": format!("resume-{n}"), "message": "hold", "idempotencyKey": format!("held-{n}") }),
            )
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
        sender.run_started(&format!("held-{n}")).await;
    }
    let mut resumer = Client::connect(&url, &[READ]).await;
    let first = resumer
        .request("runs.resume", json!({ "runId": "held-1", "fromSeq": 0 }))
        .await;
    assert_eq!(first["ok"], true, "{first}");
    let over = resumer
        .request("runs.resume", json!({ "runId": "held-2", "fromSeq": 0 }))
        .await;
    assert_refused(&over, "UNAVAILABLE", "TOO_MANY_RESUMES", "EDGE_MAX_RESUMES");
    assert_eq!(over["error"]["retryable"], true, "{over}");
    served(&mut resumer).await;
    // The followed run reaches its end on the resumed stream; then the
    // connection may resume another.
    runtime.release(1);
    resumer.chat_end("held-1").await;
    let what = "the ended follow to give its place back";
    wait_for(what, DEADLINE, async || {
        let again = resumer
            .request("runs.resume", json!({ "runId": "held-2", "fromSeq": 0 }))
            .await;
        if again["ok"] == true {
            Ok(())
        } else {
            Err(again)
        }
    })
    .await;
    runtime.release(1);
    resumer.chat_end("held-2").await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferences_are_bounded_in_users_keys_and_bytes() {
    let system = system().await;
    let mut config = system.edge_config();
    config.user_prefs_max_users = 2;
    config.user_prefs_max_bytes = 2000;
    let (url, edge) = system.edge(config).await;
    let set = |entries: Value| json!({ "entries": entries });
    // Device-less connections: each is a user of its own.
    let mut first = Client::connect(&url, &[WRITE]).await;
    let mut second = Client::connect(&url, &[WRITE]).await;
    let mut third = Client::connect(&url, &[WRITE]).await;
    for client in [&mut first, &mut second] {
        let ok = client
            .request("users.prefs.set", set(json!({ "ui.theme": "dark" })))
            .await;
        assert_eq!(ok["payload"]["status"], "ok", "{ok}");
    }
    let over = third
        .request("users.prefs.set", set(json!({ "ui.theme": "dark" })))
        .await;
    assert_refused(&over, "UNAVAILABLE", "", "EDGE_USER_PREFS_MAX_USERS");
    // A key of any length is not kept.
    let long_key = second
        .request("users.prefs.set", set(json!({ "k".repeat(257): 1 })))
        .await;
    assert_eq!(long_key["error"]["code"], "INVALID_REQUEST", "{long_key}");
    // Bytes, all users together.
    let big = second
        .request(
            "users.prefs.set",
            set(json!({ "ui.big": "x".repeat(1500) })),
        )
        .await;
    assert_eq!(big["payload"]["status"], "ok", "{big}");
    let over = first
        .request(
            "users.prefs.set",
            set(json!({ "ui.more": "y".repeat(600) })),
        )
        .await;
    assert_refused(&over, "UNAVAILABLE", "", "EDGE_USER_PREFS_MAX_BYTES");
    // Nothing kept before is lost.
    let mine = second.request("users.prefs.get", json!({})).await;
    assert_eq!(mine["payload"]["entries"]["ui.theme"], "dark", "{mine}");
    assert_eq!(
        mine["payload"]["entries"]["ui.big"].as_str().map(str::len),
        Some(1500)
    );
    // A device-less connection's preferences go with it.
    drop(first);
    wait_until(
        "the closed connection's preferences to go",
        DEADLINE,
        || edge.user_prefs.users() == 1,
    )
    .await;
    let ok = third
        .request("users.prefs.set", set(json!({ "ui.theme": "light" })))
        .await;
    assert_eq!(ok["payload"]["status"], "ok", "{ok}");
    system.stop.cancel();
}

/// A request frame padded with whitespace to `bytes`.
fn padded_wait(id: &str, run_id: &str, bytes: usize) -> String {
    let frame = json!({ "type": "req", "id": id, "method": "agent.wait",
        "params": { "runId": run_id, "timeoutMs": 600_000 } })
    .to_string();
    format!("{frame}{}", " ".repeat(bytes.saturating_sub(frame.len())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bytes_in_flight_are_bounded_across_connections() {
    let runtime = GatedRuntime::new(1);
    let system = system_with_runtime(CoordinatorConfig::default(), runtime.clone()).await;
    let mut config = system.edge_config();
    config.max_request_bytes = 64 * 1024;
    config.max_payload = 64 * 1024;
    let (url, _) = system.edge(config).await;
    let mut holder = Client::connect(&url, &[WRITE]).await;
    let mut other = Client::connect(&url, &[WRITE]).await;
    let sent = holder
        .request(
            "chat.send",
            json!({ "sessionKey": "bytes", "message": "hold", "idempotencyKey": "held" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    holder.run_started("held").await;
    // 40 KiB held by a wait; another 40 KiB, on another connection, does
    // not fit; a small request does.
    holder.send_raw(padded_wait("w-1", "held", 40 * 1024)).await;
    // A connection's frames are dispatched in order: once this is answered
    // the wait holds its bytes.
    served(&mut holder).await;
    other.send_raw(padded_wait("w-2", "held", 40 * 1024)).await;
    let over = other.response("w-2").await;
    assert_refused(
        &over,
        "UNAVAILABLE",
        "TOO_MANY_REQUEST_BYTES",
        "EDGE_MAX_REQUEST_BYTES",
    );
    assert_eq!(over["error"]["retryable"], true, "{over}");
    served(&mut other).await;
    // The held request is answered once its run ends, and its bytes are
    // given back.
    runtime.release(1);
    let waited = holder.response("w-1").await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    other.send_raw(padded_wait("w-3", "held", 40 * 1024)).await;
    let fits = other.response("w-3").await;
    assert_eq!(fits["ok"], true, "{fits}");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_queue_of_runs_not_started_is_bounded() {
    let runtime = GatedRuntime::new(1);
    let config = CoordinatorConfig {
        max_executing: 1,
        max_queued_runs: 1,
        ..CoordinatorConfig::default()
    };
    let system = system_with_runtime(config, runtime.clone()).await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &[WRITE]).await;
    let send = |n: u32| json!({ "sessionKey": format!("queue-{n}"), "message": "hold", "idempotencyKey": format!("q-{n}") });
    let running = client.request("chat.send", send(1)).await;
    assert_eq!(running["ok"], true, "{running}");
    client.run_started("q-1").await;
    let queued = client.request("chat.send", send(2)).await;
    assert_eq!(queued["ok"], true, "{queued}");
    let over = client.request("chat.send", send(3)).await;
    assert_refused(&over, "UNAVAILABLE", "", "COORDINATOR_MAX_QUEUED_RUNS");
    assert_eq!(over["error"]["retryable"], true, "{over}");
    served(&mut client).await;
    // The runs accepted run to their end; then there is room again.
    runtime.release(1);
    client.chat_end("q-1").await;
    runtime.release(1);
    client.chat_end("q-2").await;
    let again = client.request("chat.send", send(3)).await;
    assert_eq!(again["ok"], true, "{again}");
    runtime.release(1);
    client.chat_end("q-3").await;
    system.stop.cancel();
}

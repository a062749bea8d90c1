//! Abuse limits (docs/security.md): each is crossed by one client while
//! another, on the same edge, keeps working; the one that crossed gets the
//! limit's own answer in the protocol's shape.

mod common;

use std::time::Duration;

use common::*;
use futures::SinkExt;
use run_coordinator::config::CoordinatorConfig;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

/// The bystander still gets answers: `health`, and a read of a session.
async fn still_served(bystander: &mut Client) {
    let health = bystander.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    let history = bystander
        .request("chat.history", json!({ "sessionKey": "bystander" }))
        .await;
    assert_eq!(history["ok"], true, "{history}");
}

fn assert_error(answer: &Value, code: &str, message: &str) {
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["error"]["code"], code, "{answer}");
    assert_eq!(answer["error"]["message"], message, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_limit_are_refused_as_retryable() {
    let runtime = GatedRuntime::new(1);
    let system = system_with_runtime(CoordinatorConfig::default(), runtime.clone()).await;
    let mut config = system.edge_config();
    config.max_in_flight = 2;
    let (url, _) = system.edge(config).await;
    let mut flooder = Client::connect(&url, &[WRITE]).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;

    let sent = flooder
        .request(
            "chat.send",
            json!({ "sessionKey": "held", "message": "hold", "idempotencyKey": "held-1" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    flooder
        .event(|f| {
            f["event"] == "agent"
                && f["payload"]["runId"] == "held-1"
                && f["payload"]["data"]["phase"] == "start"
        })
        .await;
    // Two waits on the held run fill the connection's two places.
    let wait = |id: &str| {
        json!({ "type": "req", "id": id, "method": "agent.wait",
                "params": { "runId": "held-1", "timeoutMs": 600_000 } })
    };
    flooder.send(&wait("w-1")).await;
    flooder.send(&wait("w-2")).await;
    let over = flooder.request("health", json!({})).await;
    assert_error(
        &over,
        "UNAVAILABLE",
        "too many requests in flight on this connection (at most 2, EDGE_MAX_IN_FLIGHT)",
    );
    assert_eq!(over["error"]["retryable"], true, "{over}");
    assert_eq!(over["error"]["retryAfterMs"], 100, "{over}");
    assert_eq!(over["error"]["details"]["code"], "TOO_MANY_IN_FLIGHT");
    assert_eq!(over["error"]["details"]["limit"], 2);

    // The limit is the connection's own: another connection is served.
    still_served(&mut bystander).await;

    // Once the waits are answered, the connection has room again.
    runtime.release(1);
    for id in ["w-1", "w-2"] {
        let waited = flooder.response(id).await;
        assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    }
    let health = flooder.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    system.stop.cancel();
}

fn nested(levels: usize) -> String {
    format!("{}0{}", "[".repeat(levels), "]".repeat(levels))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_nested_too_deep_is_an_invalid_request_frame() {
    let system = system().await;
    let mut config = system.edge_config();
    config.max_json_depth = 16;
    let (url, _) = system.edge(config).await;
    let mut deep = Client::connect(&url, &[WRITE]).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;

    // The envelope is one level: params nested 15 deep is at the limit and
    // reaches the method (which refuses the unknown key), 16 is over.
    let frame = |id: &str, levels: usize| {
        format!(
            r#"{{"type":"req","id":"{id}","method":"health","params":{{"probe":{}}}}}"#,
            nested(levels - 1)
        )
    };
    deep.send_raw(frame("at-limit", 15)).await;
    let answer = deep.response("at-limit").await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("EDGE_MAX_JSON_DEPTH"), "{answer}");
    deep.send_raw(frame("over", 16)).await;
    let answer = deep.response("invalid").await;
    assert_error(
        &answer,
        "INVALID_REQUEST",
        "invalid request frame: nested deeper than 16 levels (EDGE_MAX_JSON_DEPTH)",
    );
    // Answered, not closed: the connection goes on.
    let health = deep.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    still_served(&mut bystander).await;

    // Before `connect`, a frame too deep ends the socket as any invalid
    // request frame does.
    let mut preauth = Client::open(&url).await;
    preauth.next_frame().await.expect("challenge");
    preauth.send_raw(nested(17)).await;
    assert_eq!(
        preauth.until_closed().await,
        (1008, "invalid request frame".to_owned())
    );
    still_served(&mut bystander).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_message_that_is_not_utf8_closes_with_1007() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;
    let not_utf8 = vec![b'{', 0xff, 0xfe, b'}'];

    // A text frame whose payload is not UTF-8 (sent as a raw frame, since
    // the library would not make one).
    let mut text = Client::connect(&url, &[WRITE]).await;
    let frame = Frame::message(not_utf8.clone(), OpCode::Data(Data::Text), true);
    text.ws.send(Message::Frame(frame)).await.unwrap();
    assert_eq!(
        text.until_closed().await,
        (1007, "invalid UTF-8".to_owned())
    );

    // Before `connect` too.
    let mut preauth = Client::open(&url).await;
    preauth.next_frame().await.expect("challenge");
    let frame = Frame::message(not_utf8.clone(), OpCode::Data(Data::Text), true);
    preauth.ws.send(Message::Frame(frame)).await.unwrap();
    assert_eq!(
        preauth.until_closed().await,
        (1007, "invalid UTF-8".to_owned())
    );

    // A binary frame is data, not text: one that is not UTF-8 is no JSON
    // and ignored, as the protocol ignores any such frame after `connect`.
    let mut binary = Client::connect(&url, &[WRITE]).await;
    binary.ws.send(Message::binary(not_utf8)).await.unwrap();
    let health = binary.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    still_served(&mut bystander).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_never_finishes_closes_the_socket() {
    let system = system().await;
    let mut config = system.edge_config();
    config.tick_interval = Duration::from_millis(50);
    config.frame_timeout = Duration::from_millis(200);
    let (url, _) = system.edge(config).await;
    let mut stalled = Client::connect(&url, &[WRITE]).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;

    // A masked text frame that declares 100 bytes; 10 of them come.
    let mut bytes = vec![0x81, 0x80 | 100, 7, 7, 7, 7];
    bytes.extend_from_slice(&[b'x' ^ 7; 10]);
    let MaybeTlsStream::Plain(tcp) = stalled.ws.get_mut() else {
        panic!("a plain socket");
    };
    tcp.write_all(&bytes).await.unwrap();
    tcp.flush().await.unwrap();
    assert_eq!(
        stalled.until_closed().await,
        (1008, "frame timeout".to_owned())
    );
    // The bystander has been idle between its messages for longer than the
    // timeout (all the while the stalled frame waited for it) and is not
    // touched: only a message begun and not finished counts.
    still_served(&mut bystander).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_history_refuses_a_limit_over_the_protocols_cap() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut greedy = Client::connect(&url, &[WRITE]).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;
    for limit in [
        json!(1001),
        json!(1_000_000_000_000_u64),
        json!(-1),
        json!(1.5),
    ] {
        let answer = greedy
            .request(
                "chat.history",
                json!({ "sessionKey": "greedy", "limit": limit }),
            )
            .await;
        assert_error(
            &answer,
            "INVALID_REQUEST",
            "invalid chat.history params: /limit must be an integer in 1..1000",
        );
        still_served(&mut bystander).await;
    }
    let at_cap = greedy
        .request(
            "chat.history",
            json!({ "sessionKey": "greedy", "limit": 1000 }),
        )
        .await;
    assert_eq!(at_cap["ok"], true, "{at_cap}");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_from_one_ip_are_limited_while_others_work() {
    let system = system().await;
    let mut config = system.edge_config();
    config.auth_failures_per_minute = 3;
    let (url, _) = system.edge(config).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;
    let attempt = || async {
        let mut client = Client::open(&url).await;
        client.next_frame().await.expect("challenge");
        let mut params = connect_params(&[READ]);
        params["auth"]["token"] = json!("wrong-token");
        let answer = client.request("connect", params).await;
        (answer, client.until_closed().await)
    };
    for _ in 0..3 {
        let (answer, closed) = attempt().await;
        assert_eq!(answer["error"]["details"]["code"], "AUTH_TOKEN_MISMATCH");
        assert_eq!(closed.0, 1008);
    }
    let (answer, closed) = attempt().await;
    let limited = "unauthorized: too many failed authentication attempts (retry later)";
    assert_error(&answer, "INVALID_REQUEST", limited);
    assert_eq!(answer["error"]["details"]["code"], "AUTH_RATE_LIMITED");
    assert_eq!(closed, (1008, limited.to_owned()));
    // The connection authenticated before is not affected.
    still_served(&mut bystander).await;
    system.stop.cancel();
}

/// A call a read-only connection is refused.
async fn refused(client: &mut Client) {
    let answer = client
        .request(
            "chat.send",
            json!({ "sessionKey": "not-mine", "message": "hi", "idempotencyKey": "nope" }),
        )
        .await;
    assert_error(&answer, "FORBIDDEN", "missing scope: operator.write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_unauthorized_calls_close_the_socket() {
    let system = system().await;
    let mut config = system.edge_config();
    config.unauthorized_flood_limit = 3;
    let (url, _) = system.edge(config).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;
    let mut flooder = Client::connect(&url, &[READ]).await;
    // Three refusals in a row are allowed; any other answer starts the
    // count again.
    for _ in 0..3 {
        refused(&mut flooder).await;
    }
    let health = flooder.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    for _ in 0..3 {
        refused(&mut flooder).await;
    }
    still_served(&mut bystander).await;
    // The fourth in a row is answered, then the socket closes.
    refused(&mut flooder).await;
    assert_eq!(
        flooder.until_closed().await,
        (1008, "repeated unauthorized calls".to_owned())
    );
    still_served(&mut bystander).await;
    system.stop.cancel();
}

/// The connection cap (`--max-connections`) counts sockets from their
/// upgrade to their end, authenticated or not: one more is refused 503
/// before it is upgraded, and the room comes back once a socket is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_over_the_connection_cap_are_refused_until_one_goes() {
    let system = system().await;
    let mut config = system.edge_config();
    config.max_connections = 2;
    let (url, _) = system.edge(config).await;
    let mut bystander = Client::connect(&url, &[WRITE]).await;
    // Still in its handshake: it holds its room all the same.
    let pending = Client::open(&url).await;
    assert_eq!(Client::open_with_headers(&url, &[]).await.err(), Some(503));
    still_served(&mut bystander).await;
    drop(pending);
    let what = "the room of a closed socket to come back";
    wait_for(what, DEADLINE, async || {
        match Client::open_with_headers(&url, &[]).await {
            Ok(_) => Ok(()),
            Err(503) => Err("HTTP 503"),
            Err(status) => panic!("the room of a closed socket did not come back: {status}"),
        }
    })
    .await;
    system.stop.cancel();
}

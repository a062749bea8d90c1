//! The client against a scripted gateway on loopback port 0: the
//! handshake (the challenge first, `connect` with the params given, the
//! hello or the refusal), requests answered by id with the events between
//! them queued, and the failures a caller tells apart.

use std::time::Duration;

use clawgate_client::socket::{self, WebSocket};
use clawgate_client::{ClientError, ClientInfo, ConnectParams, Connection, OpenOptions};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

type ServerSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Generous: a bound on a broken client or gateway, never a measurement.
const DEADLINE: Duration = Duration::from_secs(30);

fn params() -> ConnectParams {
    ConnectParams::operator(ClientInfo::new("test", "test", "1"), &["operator.read"]).token("t")
}

async fn send(ws: &mut ServerSocket, frame: Value) {
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

async fn receive(ws: &mut ServerSocket) -> Value {
    loop {
        match ws.next().await.expect("a frame").expect("readable") {
            Message::Text(text) => return serde_json::from_str(&text).unwrap(),
            _ => continue,
        }
    }
}

/// A gateway of one connection on port 0 that runs `script` on it; its
/// `ws://` URL.
async fn gateway<F, Fut>(script: F) -> String
where
    F: FnOnce(ServerSocket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        script(tokio_tungstenite::accept_async(stream).await.unwrap()).await;
    });
    url
}

/// The challenge, then the `connect` request checked and answered `ok`.
async fn accept(ws: &mut ServerSocket) {
    let challenge =
        json!({ "type": "event", "event": "connect.challenge", "payload": { "nonce": "n" } });
    send(ws, challenge).await;
    let connect = receive(ws).await;
    assert_eq!(connect["method"], "connect", "{connect}");
    assert_eq!(connect["params"], params().to_json());
    let hello = json!({ "type": "res", "id": connect["id"], "ok": true, "payload": { "type": "hello-ok" } });
    send(ws, hello).await;
}

#[tokio::test]
async fn connects_then_answers_by_id_and_queues_the_events_between() {
    let url = gateway(|mut ws| async move {
        accept(&mut ws).await;
        let request = receive(&mut ws).await;
        assert_eq!(request["method"], "health");
        // An event, an answer to something else, then the answer.
        send(
            &mut ws,
            json!({ "type": "event", "event": "tick", "payload": { "n": 1 } }),
        )
        .await;
        send(&mut ws, json!({ "type": "res", "id": "other", "ok": true })).await;
        let answer =
            json!({ "type": "res", "id": request["id"], "ok": false, "error": { "code": "NO" } });
        send(&mut ws, answer).await;
        send(
            &mut ws,
            json!({ "type": "event", "event": "tick", "payload": { "n": 2 } }),
        )
        .await;
    })
    .await;
    let deadline = Instant::now() + DEADLINE;
    let mut connection = Connection::connect(&url, &OpenOptions::default(), &params(), deadline)
        .await
        .unwrap();
    assert_eq!(connection.hello()["type"], "hello-ok");
    let response = connection
        .call("health", json!({}), Some(deadline))
        .await
        .unwrap();
    assert!(!response.ok());
    assert_eq!(response.error(), Some(&json!({ "code": "NO" })));
    assert_eq!(response.payload(), &Value::Null);
    let first = connection.next_event(Some(deadline)).await.unwrap();
    assert_eq!(first["payload"]["n"], 1, "the queued event first");
    let second = connection.next_event(Some(deadline)).await.unwrap();
    assert_eq!(second["payload"]["n"], 2);
}

#[tokio::test]
async fn a_refused_connect_is_its_error_shape() {
    let url = gateway(|mut ws| async move {
        send(
            &mut ws,
            json!({ "type": "event", "event": "connect.challenge", "payload": {} }),
        )
        .await;
        let connect = receive(&mut ws).await;
        let refusal = json!({ "type": "res", "id": connect["id"], "ok": false,
            "error": { "code": "INVALID_REQUEST", "details": { "code": "AUTH_TOKEN_MISMATCH" } } });
        send(&mut ws, refusal).await;
    })
    .await;
    let deadline = Instant::now() + DEADLINE;
    let refused = Connection::connect(&url, &OpenOptions::default(), &params(), deadline).await;
    match refused {
        Err(ClientError::Rejected { error }) => {
            assert_eq!(error["details"]["code"], "AUTH_TOKEN_MISMATCH");
        }
        other => panic!("not a refusal: {:?}", other.err()),
    }
}

#[tokio::test]
async fn a_gateway_that_does_not_challenge_first_is_refused() {
    let url = gateway(|mut ws| async move {
        send(
            &mut ws,
            json!({ "type": "event", "event": "tick", "payload": {} }),
        )
        .await;
        let _ = ws.next().await;
    })
    .await;
    let mut ws: WebSocket = socket::open(&url, &OpenOptions::default()).await.unwrap();
    let failed = socket::handshake(&mut ws, &params(), Instant::now() + DEADLINE).await;
    assert!(
        matches!(&failed, Err(ClientError::NoChallenge { first }) if first["event"] == "tick"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_close_a_timeout_and_a_refused_upgrade_are_told_apart() {
    let url = gateway(|mut ws| async move {
        accept(&mut ws).await;
        let _request = receive(&mut ws).await;
        ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: 1012u16.into(),
            reason: "restarting".into(),
        }))
        .await
        .unwrap();
    })
    .await;
    let deadline = Instant::now() + DEADLINE;
    let mut connection = Connection::connect(&url, &OpenOptions::default(), &params(), deadline)
        .await
        .unwrap();
    let closed = connection.call("health", json!({}), Some(deadline)).await;
    match closed {
        Err(ClientError::Closed(Some(close))) => {
            assert_eq!((close.code, close.reason.as_str()), (1012, "restarting"));
        }
        other => panic!("not a close: {:?}", other.err()),
    }

    // A gateway that never answers: the deadline passes.
    let silent = gateway(|mut ws| async move {
        accept(&mut ws).await;
        let _ = receive(&mut ws).await;
        std::future::pending::<()>().await;
    })
    .await;
    let mut connection = Connection::connect(&silent, &OpenOptions::default(), &params(), deadline)
        .await
        .unwrap();
    let soon = Instant::now() + Duration::from_millis(50);
    let timed_out = connection.call("health", json!({}), Some(soon)).await;
    let error = timed_out.expect_err("no answer");
    assert!(error.timed_out(), "{error}");
    assert_eq!(
        error.to_string(),
        "timed out waiting for the health response"
    );

    // Plain HTTP refusing the upgrade.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut stream, _) = listener.accept().await.unwrap();
        let body = "busy";
        let reply = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(reply.as_bytes()).await.unwrap();
    });
    match socket::open(&url, &OpenOptions::default()).await {
        Err(ClientError::UpgradeRefused { status, body }) => {
            assert_eq!((status, body.as_str()), (503, "busy"));
        }
        other => panic!("not a refused upgrade: {:?}", other.err()),
    }
}

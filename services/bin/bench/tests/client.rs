//! The load client against a gateway that sends a run's end before the
//! run's ACK (a run can finish before its `chat.send` is answered): the
//! end is not lost while the client waits for the answer.

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// A gateway of one connection that answers `chat.send` with the run's
/// `chat` final first and the ACK after it.
async fn end_before_ack(listener: TcpListener) {
    let (stream, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
    let challenge = json!({ "type": "event", "event": "connect.challenge", "payload": { "nonce": "n", "ts": 0 } });
    ws.send(Message::text(challenge.to_string())).await.unwrap();
    while let Some(Ok(message)) = ws.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let request: Value = serde_json::from_str(&text).unwrap();
        if request["method"] == "chat.send" {
            let run_id = request["params"]["idempotencyKey"].clone();
            let end = json!({ "type": "event", "event": "chat", "seq": 1, "payload": {
                "runId": run_id, "sessionKey": "agent:main:s", "seq": 1, "state": "final",
            }});
            ws.send(Message::text(end.to_string())).await.unwrap();
        }
        let answer = json!({ "type": "res", "id": request["id"], "ok": true, "payload": {} });
        ws.send(Message::text(answer.to_string())).await.unwrap();
    }
}

#[tokio::test]
async fn a_run_that_ends_before_its_ack_is_not_waited_for_forever() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(end_before_ack(listener));
    let (mut client, _) = clawgate_bench::client::Client::connect(&url, "t")
        .await
        .unwrap();
    let params = json!({ "sessionKey": "s", "message": "m", "idempotencyKey": "early" });
    client.send_run("early", params).await.unwrap();
}

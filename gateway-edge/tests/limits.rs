//! The size limits along the path agree (docs/limits.md): from a WebSocket
//! client, just under and just over each limit, with every service at its
//! default, gets the limit's own answer, never a transport failure further
//! in. Frame (edge) → message (coordinator) → gRPC message (coordinator's
//! server) → transcript entry and run record (store).

mod common;

use clawgate_common::limits;
use common::*;
use serde_json::{Value, json};

/// A `chat.send` request frame of exactly `size` bytes (padding the
/// message with `x`), and the length of its message.
fn chat_send_frame(id: &str, key: &str, size: usize) -> (String, usize) {
    let frame = |message: &str| {
        json!({
            "type": "req", "id": id, "method": "chat.send",
            "params": { "sessionKey": "limits", "message": message, "idempotencyKey": key },
        })
        .to_string()
    };
    let message_bytes = size - frame("").len();
    let text = frame(&"x".repeat(message_bytes));
    assert_eq!(text.len(), size);
    (text, message_bytes)
}

fn send_params(key: &str, message: &str) -> Value {
    json!({ "sessionKey": "limits", "message": message, "idempotencyKey": key })
}

fn assert_message_limit(answer: &Value, bytes: usize) {
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["error"]["code"], "INVALID_REQUEST", "{answer}");
    assert_eq!(
        answer["error"]["message"],
        format!(
            "message is {bytes} bytes; the maximum is {} (COORDINATOR_MAX_MESSAGE_BYTES)",
            limits::RUN_MAX_MESSAGE_BYTES
        ),
        "{answer}"
    );
}

/// Sends `message` and waits for the run's final chat event; returns it.
async fn run_to_final(client: &mut Client, key: &str, message: &str) -> Value {
    let sent = client.request("chat.send", send_params(key, message)).await;
    assert_eq!(sent["ok"], true, "{key}: {sent}");
    client
        .event(|f| {
            f["event"] == "chat" && f["payload"]["runId"] == key && f["payload"]["state"] != "delta"
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_answers_for_itself_just_under_and_just_over() {
    let system = system().await;
    let config = system.edge_config();
    assert_eq!(config.max_payload, limits::EDGE_MAX_PAYLOAD);
    let (url, _) = system.edge(config).await;
    let mut client = Client::connect(&url, &[WRITE]).await;

    // The coordinator's message limit: exactly at it runs (and the store
    // takes its user turn and record), one byte over is refused by name.
    let at_limit = "y".repeat(limits::RUN_MAX_MESSAGE_BYTES);
    let done = run_to_final(&mut client, "at-limit", &at_limit).await;
    assert_eq!(
        done["payload"]["state"], "final",
        "{}",
        done["payload"]["state"]
    );
    let over = format!("{at_limit}y");
    let answer = client
        .request("chat.send", send_params("over", &over))
        .await;
    assert_message_limit(&answer, over.len());

    // The store's entry and run record: a message at the limit made of the
    // characters JSON writes six times longer (`\u0001`) still fits both.
    let worst = "\u{1}".repeat(limits::RUN_MAX_MESSAGE_BYTES);
    let done = run_to_final(&mut client, "worst-case", &worst).await;
    assert_eq!(
        done["payload"]["state"], "final",
        "{}",
        done["payload"]["state"]
    );
    // The run got past its user turn (written before the runtime runs) to
    // the echo, and the store kept the answer whole.
    assert_eq!(
        done["payload"]["message"]["content"][0]["text"],
        worst.as_str()
    );
    let history = client
        .request(
            "chat.history",
            json!({ "sessionKey": "limits", "limit": 1 }),
        )
        .await;
    assert_eq!(history["ok"], true);
    let answer_turn = &history["payload"]["messages"][0];
    assert_eq!(answer_turn["role"], "assistant");
    assert_eq!(answer_turn["content"][0]["text"], worst.as_str());

    // Past tonic's 4 MiB default: still the message limit that answers (the
    // coordinator's gRPC server takes what the edge accepts).
    let large = "z".repeat(4 * 1024 * 1024 + 1);
    let answer = client
        .request("chat.send", send_params("large", &large))
        .await;
    assert_message_limit(&answer, large.len());

    // The edge's frame limit: a frame of exactly EDGE_MAX_PAYLOAD is read
    // and answered (by the message limit); one byte more closes the socket.
    let (frame, message_bytes) =
        chat_send_frame("frame-at-limit", "frame-at-limit", limits::EDGE_MAX_PAYLOAD);
    client.send_raw(frame).await;
    let answer = client.response("frame-at-limit").await;
    assert_message_limit(&answer, message_bytes);
    let (frame, _) = chat_send_frame("frame-over", "frame-over", limits::EDGE_MAX_PAYLOAD + 1);
    // The edge may close before the whole frame is written.
    let _ = futures::SinkExt::send(
        &mut client.ws,
        tokio_tungstenite::tungstenite::Message::text(frame),
    )
    .await;
    assert_eq!(
        client.until_closed().await,
        (1009, "Max payload size exceeded".to_owned())
    );
    system.stop.cancel();
}

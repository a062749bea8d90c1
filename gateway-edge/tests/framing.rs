//! Long messages leave the edge as several WebSocket frames (at most
//! `--socket-frame-bytes` of payload each, split at character boundaries),
//! and a client reads them back whole: the text of a run's final event and
//! of its history page are the message, character for character.

mod common;

use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_messages_arrive_whole_from_small_frames() {
    let system = system().await;
    let mut config = system.edge_config();
    config.socket_frame_bytes = 512;
    let (url, _) = system.edge(config).await;
    let mut client = Client::connect(&url, &[WRITE]).await;
    // One, two, three and four bytes a character: every kind of boundary
    // falls on a frame's end somewhere in 20 KB.
    let message = "aé€😀".repeat(2_000);
    let params = json!({ "sessionKey": "framing", "message": message, "idempotencyKey": "long" });
    let sent = client.request("chat.send", params).await;
    assert_eq!(sent["ok"], true, "{sent}");
    let done = client
        .event(|f| {
            f["event"] == "chat"
                && f["payload"]["runId"] == "long"
                && f["payload"]["state"] != "delta"
        })
        .await;
    assert_eq!(done["payload"]["state"], "final", "{}", done["payload"]);
    assert_eq!(
        done["payload"]["message"]["content"][0]["text"],
        message.as_str()
    );
    let history = client
        .request("chat.history", json!({ "sessionKey": "framing" }))
        .await;
    assert_eq!(history["ok"], true);
    let texts: Vec<&str> = history["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"][0]["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        texts,
        [message.as_str(), message.as_str()],
        "user turn, then the echo"
    );
}

/// Events written after a first write wait for `--event-linger` (here an
/// hour, so that nothing but an answer ends the wait) to go out together;
/// an answer to a request ends the wait at once, after the events queued
/// before it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_ends_the_event_linger() {
    let system = system().await;
    let mut config = system.edge_config();
    config.event_linger = std::time::Duration::from_secs(3600);
    let (url, _) = system.edge(config).await;
    let mut client = Client::connect(&url, &[READ, WRITE]).await;
    let params = json!({ "sessionKey": "linger", "message": "held", "idempotencyKey": "held" });
    let sent = client.request("chat.send", params).await;
    assert_eq!(sent["ok"], true, "{sent}");
    // Once the run has ended, the next answer ends the linger, and the
    // run's events, queued before it, arrive first. (The end may reach
    // the edge after `agent.wait`'s answer: Wait and the event stream are
    // separate calls, so the check is made at the first answer after the
    // final arrived, with a `health` each time until it has.)
    let waited = client
        .request(
            "agent.wait",
            json!({ "runId": "held", "timeoutMs": 60_000 }),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let final_at = |received: &[Value]| {
        received.iter().position(|f| {
            f["event"] == "chat"
                && f["payload"]["runId"] == "held"
                && f["payload"]["state"] == "final"
        })
    };
    let answer = wait_for("the run's final", DEADLINE, async || {
        let health = client.request("health", json!({})).await;
        match final_at(&client.received) {
            Some(_) => Ok(health),
            None => Err(format!("received {:?}", client.received)),
        }
    })
    .await;
    let answer_at = client
        .received
        .iter()
        .position(|f| f["type"] == "res" && f["id"] == answer["id"])
        .unwrap();
    assert!(
        final_at(&client.received).is_some_and(|at| at < answer_at),
        "the run's final came after the answer that flushed it: {:?}",
        client.received
    );
}

/// Between messages the edge drops the WebSocket library's buffers
/// (`transport::park`) and attaches them again when bytes arrive. A
/// message whose two frames arrive apart is not parked in between (the
/// edge answers a ping sent between them, so it has read the first one
/// before the second is sent) and is answered whole; an idle connection
/// then answers a ping and a request as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_frames_arrive_apart_is_read_whole() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

    async fn pong(client: &mut Client, data: &'static [u8]) {
        client.ws.send(Message::Ping(data.into())).await.unwrap();
        let waiting = async {
            loop {
                match client.ws.next().await {
                    Some(Ok(Message::Pong(got))) if got.as_ref() == data => return,
                    Some(Ok(_)) => {}
                    other => panic!("closed before the pong: {other:?}"),
                }
            }
        };
        tokio::time::timeout(DEADLINE, waiting)
            .await
            .expect("a pong");
    }

    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &[READ]).await;
    let request = json!({ "type": "req", "id": "apart", "method": "health", "params": {} });
    let text = request.to_string().into_bytes();
    let (head, tail) = text.split_at(10);
    let first = Frame::message(head.to_vec(), OpCode::Data(Data::Text), false);
    client.ws.send(Message::Frame(first)).await.unwrap();
    pong(&mut client, b"between").await;
    let last = Frame::message(tail.to_vec(), OpCode::Data(Data::Continue), true);
    client.ws.send(Message::Frame(last)).await.unwrap();
    let answer = client.response("apart").await;
    assert_eq!(answer["ok"], true, "{answer}");
    // Idle again: parked, and attached again by the next bytes.
    pong(&mut client, b"idle").await;
    let health = client.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
}

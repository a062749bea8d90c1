//! Long messages leave the edge as several WebSocket frames (at most
//! `--socket-frame-bytes` of payload each, split at character boundaries),
//! and a client reads them back whole: the text of a run's final event and
//! of its history page are the message, character for character.

mod common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_messages_arrive_whole_from_small_frames() {
    let system = System::start().await;
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

//! Transcript entries as the protocol's messages: the message each entry
//! is, and the message ids this edge writes (`<sessionId>:<seq>`), by which
//! clients page history.

use serde_json::{Value, json};
use session_store_api::model::{SessionId, TranscriptEntry};

use super::frames::without_nulls;

/// A message id as this edge writes them: `<sessionId>:<seq>`.
pub fn message_id(session_id: &str, seq: u64) -> String {
    format!("{session_id}:{seq}")
}

pub fn parse_message_id(id: &str) -> Option<(Option<SessionId>, u64)> {
    let (session, seq) = id.rsplit_once(':')?;
    let seq = seq.parse().ok().filter(|&n| n >= 1)?;
    Some((session.parse().ok(), seq))
}

/// One transcript entry of session `id` as a protocol message.
pub fn transcript_message(id: &str, e: &TranscriptEntry) -> Value {
    let content: Value =
        serde_json::from_str(&e.content_json).unwrap_or_else(|_| json!(e.content_json));
    let usage = e
        .metadata
        .usage_json
        .as_deref()
        .and_then(|u| serde_json::from_str::<Value>(u).ok());
    // A user turn carries its run's idempotency key, by which a
    // client matches the message it showed while sending.
    let idempotency_key = (e.role == "user").then(|| format!("{}:user", e.run_id));
    without_nulls(json!({
        "role": e.role, "content": content, "timestamp": e.timestamp_ms,
        "stopReason": e.metadata.stop_reason, "usage": usage,
        "aborted": e.metadata.aborted.then_some(true),
        "idempotencyKey": idempotency_key,
        "__openclaw": {
            "id": message_id(id, e.seq), "seq": e.seq, "runId": e.run_id,
            "idempotencyKey": idempotency_key,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_round_trip() {
        let id = uuid::Uuid::new_v4().to_string();
        let parsed = parse_message_id(&message_id(&id, 7)).unwrap();
        assert_eq!(parsed.0.map(|s| s.to_string()), Some(id));
        assert_eq!(parsed.1, 7);
        assert_eq!(parse_message_id("nope"), None);
        assert_eq!(parse_message_id("x:0"), None);
    }
}

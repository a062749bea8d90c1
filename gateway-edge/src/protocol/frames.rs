//! The three frame types of the gateway protocol and the error shape.
//!
//! Outgoing frames are built as `serde_json::Value` objects with absent
//! optional fields omitted (never `null`): clients validate frames against
//! closed schemas and silently drop a frame that does not fit.

use serde_json::{Map, Value, json};

/// A request frame as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: String,
    pub method: String,
    /// `{}` when the client sent none.
    pub params: Value,
    /// W3C trace context of the caller, if sent.
    pub traceparent: Option<String>,
}

/// Why a text frame is not a request.
#[derive(Debug, Clone, PartialEq)]
pub enum FrameError {
    /// Not JSON at all.
    NotJson,
    /// JSON, but not a valid request frame; carries the id when one was
    /// readable and a description.
    Invalid { id: Option<String>, reason: String },
}

const REQUEST_KEYS: [&str; 5] = ["type", "id", "method", "params", "traceparent"];

/// Parses and validates a request frame (closed schema).
pub fn parse_request(text: &str) -> Result<Request, FrameError> {
    let value: Value = serde_json::from_str(text).map_err(|_| FrameError::NotJson)?;
    let Value::Object(object) = value else {
        return Err(FrameError::Invalid {
            id: None,
            reason: "must be object".into(),
        });
    };
    let id = object.get("id").and_then(Value::as_str).map(str::to_owned);
    let invalid = |reason: String| FrameError::Invalid {
        id: id.clone(),
        reason,
    };
    if let Some(extra) = object.keys().find(|k| !REQUEST_KEYS.contains(&k.as_str())) {
        return Err(invalid(format!(
            "must NOT have additional properties ({extra})"
        )));
    }
    if object.get("type").and_then(Value::as_str) != Some("req") {
        return Err(invalid("type must be \"req\"".into()));
    }
    let id = match object.get("id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        Some(_) => return Err(invalid("id must be a non-empty string".into())),
        None => return Err(invalid("must have required property 'id'".into())),
    };
    let method = match object.get("method") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(invalid("method must be a non-empty string".into())),
        None => return Err(invalid("must have required property 'method'".into())),
    };
    let traceparent = match object.get("traceparent") {
        None => None,
        Some(Value::String(t)) if t.len() <= 128 => Some(t.clone()),
        Some(_) => {
            return Err(invalid(
                "traceparent must be a string of at most 128 characters".into(),
            ));
        }
    };
    Ok(Request {
        id,
        method,
        params: object.get("params").cloned().unwrap_or_else(|| json!({})),
        traceparent,
    })
}

/// The protocol's error shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorShape {
    pub code: &'static str,
    pub message: String,
    /// Boxed: errors travel through many `Result`s and stay small.
    pub details: Option<Box<Value>>,
    /// `retryable: true` with `retryAfterMs`, when set.
    pub retry_after_ms: Option<u64>,
}

impl ErrorShape {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            code,
            // An empty message fails client validation.
            message: if message.is_empty() {
                code.to_owned()
            } else {
                message
            },
            details: None,
            retry_after_ms: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("INVALID_REQUEST", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new("UNAVAILABLE", message)
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    pub fn retry_after(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }

    pub fn to_value(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        if let Some(details) = &self.details {
            error.insert("details".into(), (**details).clone());
        }
        if let Some(ms) = self.retry_after_ms {
            error.insert("retryable".into(), json!(true));
            error.insert("retryAfterMs".into(), json!(ms));
        }
        Value::Object(error)
    }
}

/// `{"type":"res","id",…,"ok":true,"payload"}`.
pub fn ok_response(id: &str, payload: Value) -> String {
    json!({ "type": "res", "id": id, "ok": true, "payload": payload }).to_string()
}

/// `{"type":"res","id",…,"ok":false,"error"}`, with a payload when given.
pub fn error_response(id: &str, error: &ErrorShape, payload: Option<Value>) -> String {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("res"));
    frame.insert("id".into(), json!(id));
    frame.insert("ok".into(), json!(false));
    if let Some(payload) = payload {
        frame.insert("payload".into(), payload);
    }
    frame.insert("error".into(), error.to_value());
    Value::Object(frame).to_string()
}

/// An event frame; `seq` only on broadcast events.
pub fn event(name: &str, payload: &Value, seq: Option<u64>) -> String {
    event_frame(name, &payload.to_string(), seq)
}

/// An event frame around a payload already encoded (`payload_json`, one
/// JSON value): what a fan-out to many connections builds per connection,
/// so that the payload is encoded once, not once per connection. Members in
/// the order `serde_json` writes an object's (sorted), byte for byte what
/// `event` wrote before.
pub fn event_frame(name: &str, payload_json: &str, seq: Option<u64>) -> String {
    use std::fmt::Write as _;
    let len = event_frame_len_of(encoded_name_len(name), payload_json, seq);
    let mut frame = String::with_capacity(len);
    frame.push_str("{\"event\":");
    if needs_no_escape(name) {
        let _ = write!(frame, "\"{name}\"");
    } else {
        frame.push_str(&Value::from(name).to_string());
    }
    frame.push_str(",\"payload\":");
    frame.push_str(payload_json);
    if let Some(seq) = seq {
        let _ = write!(frame, ",\"seq\":{seq}");
    }
    frame.push_str(",\"type\":\"event\"}");
    frame
}

/// The length of `event_frame(name, payload_json, seq)`, without building it.
pub fn event_frame_len(name: &str, payload_json: &str, seq: Option<u64>) -> usize {
    event_frame_len_of(encoded_name_len(name), payload_json, seq)
}

/// Whether `name` is its JSON string between quotes (the edge's event
/// names are: no allocation for them in the per-connection path).
fn needs_no_escape(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

fn encoded_name_len(name: &str) -> usize {
    match needs_no_escape(name) {
        true => name.len() + 2,
        false => Value::from(name).to_string().len(),
    }
}

fn event_frame_len_of(encoded_name_len: usize, payload_json: &str, seq: Option<u64>) -> usize {
    const FIXED: usize = r#"{"event":,"payload":,"type":"event"}"#.len();
    let seq_len = seq.map_or(0, |seq| r#","seq":"#.len() + decimal_digits(seq));
    FIXED + encoded_name_len + payload_json.len() + seq_len
}

fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// Removes `null` members recursively from objects (absent, not null).
pub fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    /// The concatenated frame is the one a JSON object of the same members
    /// encodes to, with and without a seq.
    #[test]
    fn event_frames_are_the_encoded_objects() {
        let payload = json!({ "runId": "r\"1", "text": "é\n", "n": [1, 2], "z": null });
        for seq in [None, Some(7), Some(10), Some(u64::MAX)] {
            let mut object = Map::new();
            object.insert("type".into(), json!("event"));
            object.insert("event".into(), json!("chat"));
            object.insert("payload".into(), payload.clone());
            if let Some(seq) = seq {
                object.insert("seq".into(), json!(seq));
            }
            let expected = Value::Object(object).to_string();
            assert_eq!(event_frame("chat", &payload.to_string(), seq), expected);
            let len = event_frame_len("chat", &payload.to_string(), seq);
            assert_eq!(len, expected.len());
            assert_eq!(event("chat", &payload, seq), expected);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_defaults_params() {
        let req = parse_request(r#"{"type":"req","id":"1","method":"health"}"#).unwrap();
        assert_eq!(req.params, json!({}));
        assert_eq!(parse_request("nope"), Err(FrameError::NotJson));
        let err = parse_request(r#"{"type":"req","id":"7","method":"x","extra":1}"#).unwrap_err();
        assert!(matches!(err, FrameError::Invalid { id: Some(ref id), .. } if id == "7"));
        assert!(parse_request(r#"{"type":"event","id":"1","method":"x"}"#).is_err());
        assert!(parse_request(r#"{"type":"req","id":"","method":"x"}"#).is_err());
    }

    #[test]
    fn frames_omit_absent_fields() {
        let error = ErrorShape::invalid("");
        assert_eq!(
            error.to_value(),
            json!({"code":"INVALID_REQUEST","message":"INVALID_REQUEST"})
        );
        let event = event("tick", &json!({"ts": 1}), None);
        assert!(!event.contains("seq"));
        assert_eq!(
            without_nulls(json!({"a": null, "b": {"c": null, "d": 1}})),
            json!({"b": {"d": 1}})
        );
    }
}

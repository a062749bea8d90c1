//! [`check_frame`]: one text frame through the edge's frame parsing.

use serde_json::{Value, json};

use super::check_answer;
use crate::auth::registry;
use crate::auth::scopes::{self, ADMIN, APPROVALS, Access, KNOWN_SCOPES, QUESTIONS, READ, WRITE};
use crate::methods::{self, SERVED_METHODS};
use crate::protocol::frames::{self, ErrorShape, FrameError};
use crate::protocol::json_depth;

const REQUEST_KEYS: &[&str] = &["type", "id", "method", "params", "traceparent"];

/// The request frame schema, restated from the protocol (§2.1) as an
/// independent oracle for `parse_request`.
fn is_request_frame(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    let non_empty = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    object.keys().all(|k| REQUEST_KEYS.contains(&k.as_str()))
        && object.get("type").and_then(Value::as_str) == Some("req")
        && non_empty("id")
        && non_empty("method")
        && object
            .get("traceparent")
            .is_none_or(|t| t.as_str().is_some_and(|t| t.len() <= 128))
}

/// A text frame (the socket hands over UTF-8 only; other bytes are skipped).
///
/// Oracle: `NotJson` exactly for text that is not JSON; `Invalid` exactly
/// for JSON that breaks the request schema, carrying the frame's string
/// `id`; an accepted request carries the frame's fields unchanged. The
/// scope lookup is total, and the answers and events the edge would build
/// are the JSON they claim to be.
pub fn check_frame(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = serde_json::from_str::<Value>(text);
    // The nesting bound the dispatch applies first (`EDGE_MAX_JSON_DEPTH`)
    // counts what the parser sees.
    match &parsed {
        Ok(_) => {
            let depth = serde_json::from_str::<Depth>(text)
                .expect("what parses as a value parses as a depth")
                .0;
            assert!(
                !json_depth::nests_deeper_than(text, depth),
                "depth {depth} overcounted"
            );
            if depth > 0 {
                assert!(
                    json_depth::nests_deeper_than(text, depth - 1),
                    "depth {depth} undercounted"
                );
            }
        }
        Err(_) => {
            json_depth::nests_deeper_than(text, 64);
        }
    }
    match frames::parse_request(text) {
        Err(FrameError::NotJson) => assert!(parsed.is_err(), "JSON refused as not JSON"),
        Err(FrameError::Invalid { id, reason }) => {
            let value = parsed.expect("a frame that is not JSON is NotJson");
            assert!(
                !is_request_frame(&value),
                "a valid request frame refused: {reason}"
            );
            assert!(!reason.is_empty(), "an invalid frame without a reason");
            assert_eq!(
                id.as_deref(),
                value.get("id").and_then(Value::as_str),
                "the refusal names another id"
            );
            // What the edge answers an authenticated connection.
            let error = ErrorShape::invalid(format!("invalid request frame: {reason}"));
            let id = id.as_deref().unwrap_or("invalid");
            check_answer(&frames::error_response(id, &error, None), id);
        }
        Ok(request) => {
            let value = parsed.expect("an accepted frame is JSON");
            assert!(
                is_request_frame(&value),
                "an invalid frame accepted: {text}"
            );
            assert_eq!(value["id"], json!(request.id));
            assert_eq!(value["method"], json!(request.method));
            assert_eq!(
                value.get("params").cloned().unwrap_or_else(|| json!({})),
                request.params
            );
            assert_eq!(
                value.get("traceparent").and_then(Value::as_str),
                request.traceparent.as_deref()
            );
            check_scope_lookup(&request.method, &request.params);
            check_encoders(&request.id, &request.method, &request.params);
        }
    }
}

/// `required_access` and `authorize` for any method name and params.
fn check_scope_lookup(method: &str, params: &Value) {
    let required = methods::required_access(method, params);
    if !SERVED_METHODS.contains(&method) {
        assert_eq!(required, registry::access(method, params));
    }
    if let Some(scope) = required.scope() {
        assert!(
            KNOWN_SCOPES.contains(&scope) || scope == "operator.sessions.write",
            "unknown scope {scope}"
        );
    }
    for held in [
        &[][..],
        &[READ],
        &[WRITE],
        &[ADMIN],
        &[APPROVALS, QUESTIONS],
    ] {
        let held: Vec<String> = held.iter().map(|s| s.to_string()).collect();
        match scopes::authorize(required, "operator", &held) {
            Ok(()) => assert!(required.scope().is_none_or(|r| scopes::grants(&held, r))),
            Err(error) if required == Access::Node => assert_eq!(error.code, "INVALID_REQUEST"),
            Err(error) => {
                assert_eq!(error.code, "FORBIDDEN");
                assert_eq!(
                    error.details.as_deref().map(|d| &d["code"]),
                    Some(&json!("MISSING_SCOPE"))
                );
            }
        }
    }
    if let Access::Operator(_) = required {
        let error = scopes::authorize(required, "node", &[ADMIN.to_owned()]).unwrap_err();
        assert_eq!(error.code, "INVALID_REQUEST");
    }
}

/// The answer and event frames built around a request's values.
fn check_encoders(id: &str, method: &str, params: &Value) {
    check_answer(&frames::ok_response(id, params.clone()), id);
    let error = ErrorShape::invalid(method)
        .with_details(params.clone())
        .retry_after(7);
    check_answer(&frames::error_response(id, &error, None), id);
    let payload = params.to_string();
    // No seq, and one whose digits depend on the input.
    for seq in [None, Some(u64::MAX >> (id.len() % 64))] {
        let frame = frames::event_frame(method, &payload, seq);
        assert_eq!(frame.len(), frames::event_frame_len(method, &payload, seq));
        let mut expected = json!({ "type": "event", "event": method, "payload": params });
        if let Some(seq) = seq {
            expected["seq"] = json!(seq);
        }
        assert_eq!(frame, expected.to_string(), "event frame of {method:?}");
    }
    assert_eq!(
        frames::event(method, params, None),
        frames::event_frame(method, &payload, None)
    );
    let cleaned = frames::without_nulls(params.clone());
    assert!(
        !has_null_member(&cleaned),
        "without_nulls left a null member"
    );
}

/// How many arrays and objects a JSON text opens inside one another, as
/// the parser reads it: duplicate keys included (a parsed `Value` keeps
/// only the last of them, and with it maybe less nesting).
struct Depth(u32);

impl<'de> serde::Deserialize<'de> for Depth {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DepthVisitor)
    }
}

struct DepthVisitor;

impl<'de> serde::de::Visitor<'de> for DepthVisitor {
    type Value = Depth;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_str<E>(self, _: &str) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_unit<E>(self) -> Result<Depth, E> {
        Ok(Depth(0))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Depth, A::Error> {
        let mut deepest = 0;
        while let Some(Depth(depth)) = seq.next_element()? {
            deepest = deepest.max(depth);
        }
        Ok(Depth(deepest + 1))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Depth, A::Error> {
        let mut deepest = 0;
        while let Some((serde::de::IgnoredAny, Depth(depth))) = map.next_entry()? {
            deepest = deepest.max(depth);
        }
        Ok(Depth(deepest + 1))
    }
}

fn has_null_member(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.values().any(|v| v.is_null() || has_null_member(v)),
        Value::Array(items) => items.iter().any(has_null_member),
        _ => false,
    }
}

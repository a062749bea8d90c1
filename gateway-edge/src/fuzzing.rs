//! The bodies of the edge's fuzz targets (`fuzz/`, `cargo fuzz`), shared
//! with the stable smoke test (`tests/fuzz_corpus.rs`) so both run the same
//! code. Not an API: each `check_*` takes one input, runs it through the
//! edge's own parsing and validation, and panics when the edge panics or
//! when its answer is not well-formed (see each function's oracle).
//!
//! - [`check_frame`]: a text frame through the nesting bound
//!   (`json_depth`), `frames::parse_request`, the scope lookup and the
//!   answer/event encoders.
//! - [`check_connect`]: `connect` params through `handshake::parse_connect`
//!   and what follows it without a network: `negotiate`, `check_role`,
//!   `effective_scopes`, the device signature check and device tokens.
//! - [`check_method_params`]: one served method's params through the real
//!   dispatch and handler (`methods::dispatch`), on an edge whose backends
//!   refuse every connection: each handler validates its params and answers
//!   `INVALID_REQUEST`, or passes them and meets `UNAVAILABLE` at its first
//!   backend call (or answers, for the methods that need no backend).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::config::EdgeConfig;
use crate::conn::{ClientInfo, Conn, Outbox, OutboxReader};
use crate::device::{DeviceProof, DeviceTokens, SignedContext, signed_token, verify_device};
use crate::edge::{Backends, Edge};
use crate::frames::{self, ErrorShape, FrameError};
use crate::handshake::{self, PROTOCOL_VERSION, Rejection};
use crate::json_depth;
use crate::methods::{self, SERVED_METHODS};
use crate::scopes::{self, ADMIN, APPROVALS, KNOWN_SCOPES, QUESTIONS, READ, WRITE};

/// The error codes an answer of this edge may carry.
pub const ERROR_CODES: &[&str] = &["INVALID_REQUEST", "UNAVAILABLE", "FORBIDDEN"];

// ---------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------

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

/// `required_scope` and `authorize` for any method name and params.
fn check_scope_lookup(method: &str, params: &Value) {
    let required = methods::required_scope(method, params);
    if !SERVED_METHODS.contains(&method) {
        assert_eq!(required, Some(scopes::unserved_scope(method)));
    }
    if let Some(scope) = required {
        assert!(KNOWN_SCOPES.contains(&scope), "unknown scope {scope}");
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
            Ok(()) => assert!(required.is_none_or(|r| scopes::grants(&held, r))),
            Err(error) => {
                assert_eq!(error.code, "FORBIDDEN");
                assert_eq!(
                    error.details.as_deref().map(|d| &d["code"]),
                    Some(&json!("MISSING_SCOPE"))
                );
            }
        }
    }
    if required.is_some() {
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

/// A `res` frame for `id`: ok with a payload, or a well-formed error.
fn check_answer(frame: &str, id: &str) -> Value {
    let value: Value = serde_json::from_str(frame).expect("an answer is JSON");
    assert_eq!(value["type"], "res", "{frame}");
    assert_eq!(value["id"], id, "{frame}");
    match value["ok"].as_bool() {
        Some(true) => assert!(
            value.get("payload").is_some(),
            "ok without payload: {frame}"
        ),
        Some(false) => {
            let error = &value["error"];
            let code = error["code"].as_str().unwrap_or_default();
            assert!(ERROR_CODES.contains(&code), "unknown error code: {frame}");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "an error without a message: {frame}"
            );
            if error.get("retryable").is_some() {
                assert_eq!(error["retryable"], true, "{frame}");
                assert!(error["retryAfterMs"].is_u64(), "{frame}");
            }
        }
        None => panic!("an answer without ok: {frame}"),
    }
    value
}

// ---------------------------------------------------------------------------
// connect
// ---------------------------------------------------------------------------

/// A key no closed object of the protocol has.
const UNKNOWN_KEY: &str = "fuzzUnknownKey";

/// `connect` params (JSON; other bytes are skipped).
///
/// Oracle: a refusal is the protocol's (`INVALID_REQUEST`, close 1008, or
/// 1002 for a protocol mismatch, the close reason a prefix of the message
/// of at most 120 bytes); accepted params are an object whose fields are
/// carried as sent, and adding an unknown key to it or to its `client`
/// makes it refused (the schema is closed). `negotiate`, `check_role` and
/// `effective_scopes` follow their rules; a device token issued for the
/// connection verifies back to its role and scopes.
pub fn check_connect(data: &[u8]) {
    let Ok(params) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let parsed = match handshake::parse_connect(&params) {
        Ok(parsed) => parsed,
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1008);
            assert!(
                rejection
                    .error
                    .message
                    .starts_with("invalid connect params: "),
                "{}",
                rejection.error.message
            );
            return;
        }
    };
    let object = params
        .as_object()
        .expect("accepted connect params are an object");
    let client = object["client"].as_object().expect("client is an object");
    let text =
        |o: &Map<String, Value>, key: &str| o.get(key).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(Some(&parsed.client_id), text(client, "id").as_ref());
    assert_eq!(Some(&parsed.client_mode), text(client, "mode").as_ref());
    assert_eq!(
        Some(&parsed.client_version),
        text(client, "version").as_ref()
    );
    assert_eq!(Some(&parsed.platform), text(client, "platform").as_ref());
    assert_eq!(parsed.device_family, text(client, "deviceFamily"));
    assert_eq!(parsed.display_name, text(client, "displayName"));
    assert_eq!(parsed.instance_id, text(client, "instanceId"));
    for field in [
        &parsed.client_id,
        &parsed.client_mode,
        &parsed.client_version,
        &parsed.platform,
    ] {
        assert!(!field.is_empty());
    }
    assert_eq!(
        parsed.role,
        text(object, "role").unwrap_or_else(|| "operator".into())
    );
    assert_eq!(parsed.min_protocol, object["minProtocol"].as_u64().unwrap());
    assert_eq!(parsed.max_protocol, object["maxProtocol"].as_u64().unwrap());
    assert!(parsed.min_protocol >= 1 && parsed.max_protocol >= 1);
    let strings = |key: &str| -> Vec<String> {
        object
            .get(key)
            .and_then(Value::as_array)
            .map_or_else(Vec::new, |items| {
                items
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect()
            })
    };
    assert_eq!(parsed.scopes, strings("scopes"));
    assert_eq!(parsed.caps, strings("caps"));
    assert!(parsed.auth.values().all(Value::is_string));
    // The schema is closed at the top and in `client`.
    let mut extra = object.clone();
    extra.insert(UNKNOWN_KEY.into(), json!(true));
    assert!(
        handshake::parse_connect(&Value::Object(extra)).is_err(),
        "an unknown key accepted"
    );
    let mut extra = object.clone();
    extra["client"][UNKNOWN_KEY] = json!("x");
    assert!(
        handshake::parse_connect(&Value::Object(extra)).is_err(),
        "an unknown client key accepted"
    );
    let mut without_client = object.clone();
    without_client.remove("client");
    assert!(handshake::parse_connect(&Value::Object(without_client)).is_err());

    let (min, max) = (parsed.min_protocol, parsed.max_protocol);
    let speaks = min <= PROTOCOL_VERSION && PROTOCOL_VERSION <= max;
    let probe = parsed.client_mode == "probe"
        && max >= handshake::MIN_PROBE_PROTOCOL
        && min <= PROTOCOL_VERSION;
    let node = parsed.role == "node"
        && parsed.client_mode == "node"
        && (min..=max).contains(&handshake::MIN_NODE_PROTOCOL);
    match handshake::negotiate(&parsed) {
        Ok(protocol) => {
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert!(speaks || probe || node, "protocol {min}..{max} accepted");
        }
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1002);
            assert!(!(speaks || probe || node), "protocol {min}..{max} refused");
            let details = rejection
                .error
                .details
                .as_deref()
                .expect("mismatch details");
            assert_eq!(details["code"], "PROTOCOL_MISMATCH");
        }
    }
    match handshake::check_role(&parsed) {
        Ok(()) => assert_eq!(parsed.role, "operator"),
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1008);
            assert_ne!(parsed.role, "operator");
        }
    }
    for verified in [false, true] {
        let scopes = handshake::effective_scopes(&parsed, verified);
        let mut expected: Vec<String> = Vec::new();
        if parsed.role == "operator" && (verified || parsed.client_mode != "probe") {
            for scope in &parsed.scopes {
                if KNOWN_SCOPES.contains(&scope.as_str()) && !expected.contains(scope) {
                    expected.push(scope.clone());
                }
            }
        }
        assert_eq!(
            scopes, expected,
            "effective scopes (device verified: {verified})"
        );
    }
    check_device(&parsed);
}

/// The device block's signature check (at the time and nonce it claims,
/// so that a recorded client's signature is checked all the way), and
/// device tokens for the connection.
fn check_device(parsed: &handshake::ConnectParams) {
    let tokens = DeviceTokens::new([0x5a; 32]);
    let device_id = parsed
        .device
        .as_ref()
        .map_or("no-device", |d| d.id.as_str());
    for key in ["token", "deviceToken"] {
        if let Some(token) = parsed.auth_str(key) {
            // Not issued by this secret (the MAC is checked first).
            assert_eq!(tokens.verify(token, device_id), None);
        }
    }
    let scopes = handshake::effective_scopes(parsed, true);
    let token = tokens.issue(device_id, &parsed.role, &scopes, 1_800_000_000_000);
    let issued = tokens
        .verify(&token, device_id)
        .expect("an issued token verifies");
    assert_eq!(issued.role, parsed.role);
    let mut sorted = scopes.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(issued.scopes, sorted);
    assert_eq!(tokens.verify(&token, &format!("{device_id}x")), None);

    let Some(device) = &parsed.device else {
        return;
    };
    let proof = DeviceProof {
        id: &device.id,
        public_key: &device.public_key,
        signature: &device.signature,
        signed_at_ms: device.signed_at,
        nonce: &device.nonce,
    };
    let context = SignedContext {
        client_id: &parsed.client_id,
        client_mode: &parsed.client_mode,
        role: &parsed.role,
        scopes: &parsed.scopes,
        token: signed_token(
            parsed.auth_str("token"),
            parsed.auth_str("deviceToken"),
            parsed.auth_str("bootstrapToken"),
        ),
        platform: Some(&parsed.platform),
        device_family: parsed.device_family.as_deref(),
    };
    for nonce in [device.nonce.trim(), "another-nonce"] {
        match verify_device(&proof, &context, nonce, device.signed_at) {
            Ok(verified) => {
                assert_eq!(verified.device_id, device.id);
                assert!(matches!(verified.payload_version, 2 | 3));
            }
            Err(err) => {
                assert!(!err.message().is_empty() && !err.code().is_empty());
                assert!(!err.reason().is_empty());
            }
        }
    }
    let _ = crate::device::decode_public_key(&device.public_key);
}

/// The shape every handshake refusal has.
fn check_rejection(rejection: &Rejection) {
    assert_eq!(rejection.error.code, "INVALID_REQUEST");
    assert!(!rejection.error.message.is_empty());
    assert!(rejection.close_reason.len() <= 120);
    if rejection.close_code == 1008 {
        assert!(rejection.error.message.starts_with(&rejection.close_reason));
    }
    let frame = frames::error_response("connect-1", &rejection.error, None);
    check_answer(&frame, "connect-1");
}

// ---------------------------------------------------------------------------
// Method params
// ---------------------------------------------------------------------------

/// Who the fuzzed request comes from: `admin` (the default), `write`,
/// `read`, `none` (no scopes), `approvals` or `ui` (admin, mode `webchat`).
fn profile(name: &str) -> (&'static [&'static str], &'static str) {
    match name {
        "write" => (&[WRITE, READ], "cli"),
        "read" => (&[READ], "cli"),
        "none" => (&[], "cli"),
        "approvals" => (&[APPROVALS, QUESTIONS, READ], "cli"),
        "ui" => (&[ADMIN], "webchat"),
        _ => (&[ADMIN], "cli"),
    }
}

/// The input of [`check_method_params`]: `<method>[ <profile>]\n<params JSON>`.
/// A first line that names no served method picks one from its bytes.
pub fn method_input(method: &str, profile: Option<&str>, params: &Value) -> Vec<u8> {
    let head = match profile {
        Some(profile) => format!("{method} {profile}"),
        None => method.to_owned(),
    };
    format!("{head}\n{params}").into_bytes()
}

fn split_method_input(data: &[u8]) -> Option<(&'static str, &str, Value)> {
    let newline = data.iter().position(|&b| b == b'\n')?;
    let (head, body) = (&data[..newline], &data[newline + 1..]);
    let params = serde_json::from_slice::<Value>(body).ok()?;
    let head = String::from_utf8_lossy(head);
    let (name, profile) = head.split_once(' ').unwrap_or((&head, ""));
    let method = match SERVED_METHODS.iter().find(|m| **m == name) {
        Some(method) => method,
        None => {
            let sum = head
                .bytes()
                .fold(0usize, |acc, b| acc.wrapping_mul(31).wrapping_add(b.into()));
            SERVED_METHODS[sum % SERVED_METHODS.len()]
        }
    };
    let profile = ["write", "read", "none", "approvals", "ui"]
        .into_iter()
        .find(|p| *p == profile)
        .unwrap_or("admin");
    Some((method, profile, params))
}

/// Ranges of integer params the handlers check before any backend call
/// (docs/gateway-edge.md, Methods): an accepted params object has each
/// in its range.
const RANGES: &[(&str, &str, u64, u64)] = &[
    ("agent", "timeout", 0, 172_800),
    ("agent.wait", "timeoutMs", 0, 86_400_000),
    ("chat.send", "timeoutMs", 0, 172_800_000),
    ("chat.history", "limit", 1, 1000),
    ("chat.history", "maxChars", 1, 500_000),
    ("chat.history", "maxBytes", 1024, u64::MAX),
    ("chat.history", "offset", 0, u64::MAX),
    ("chat.history", "pendingBefore", 1, u64::MAX),
    ("chat.startup", "limit", 1, 1000),
    ("chat.startup", "maxChars", 1, 500_000),
    ("chat.startup", "maxBytes", 1024, u64::MAX),
    ("sessions.list", "limit", 1, u64::MAX),
    ("sessions.list", "offset", 0, 100_000),
    ("sessions.list", "activeMinutes", 1, 10_000_000),
    ("runs.resume", "fromSeq", 0, u64::MAX >> 1),
];

/// The Control UI's reconnect marker, stripped from UI clients' `chat.send`.
const RECONNECT_MARKER: &str = "__controlUiReconnectResume";

/// One served method's params (see [`method_input`] for the format; other
/// bytes are skipped), dispatched on a connection of the chosen profile.
///
/// Oracle: exactly one `res` for the request, well-formed, and no task of
/// it left running; a caller without the method's scope hears `FORBIDDEN`;
/// a refused additional property is one the method does not declare; and
/// params that pass validation (an `ok` answer, or `UNAVAILABLE` from the
/// first backend call) are an object of declared keys only, with each
/// range-checked integer in its range — and adding an unknown key to them
/// makes them refused.
pub fn check_method_params(data: &[u8]) {
    let Some((method, profile_name, params)) = split_method_input(data) else {
        return;
    };
    HARNESS.with(|harness| {
        let mut harness = harness.borrow_mut();
        let harness = harness.get_or_insert_with(Harness::new);
        harness.check(method, profile_name, params);
    });
}

thread_local! {
    static HARNESS: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) };
}

/// A current-thread runtime and an edge whose backends refuse connections.
struct Harness {
    runtime: tokio::runtime::Runtime,
    edge: Arc<Edge>,
    calls: u32,
}

/// Nobody listens there: every backend call fails at once with UNAVAILABLE.
const UNREACHABLE: &str = "http://127.0.0.1:1";
/// The edge is made anew after this many calls, so that what it keeps
/// per session or user (subscriptions, preferences) stays small.
const CALLS_PER_EDGE: u32 = 5000;
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

impl Harness {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let edge = Self::edge(&runtime);
        Self {
            runtime,
            edge,
            calls: 0,
        }
    }

    fn edge(runtime: &tokio::runtime::Runtime) -> Arc<Edge> {
        let _entered = runtime.enter();
        let mut config = EdgeConfig::with_token(UNREACHABLE.into(), UNREACHABLE.into(), "fuzz");
        // Fail at once instead of following a leader.
        config.coordinator_failover_timeout = Duration::ZERO;
        let backends = Backends::connect_lazy(&config).expect("lazy backends");
        Edge::new(config, backends)
    }

    fn conn(&self, profile_name: &str) -> (Arc<Conn>, OutboxReader) {
        let (scopes, mode) = profile(profile_name);
        let (outbox, reader) = Outbox::new(
            self.edge.config.max_buffered_bytes,
            self.edge.metrics.clone(),
        );
        let conn = Arc::new(Conn {
            id: self.edge.next_conn_id(),
            conn_id: "fuzz-conn".into(),
            role: "operator".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            tool_events: false,
            requester: format!("fuzz-{profile_name}"),
            outbox,
            sessions_subscribed: AtomicBool::new(false),
            runs: Default::default(),
            client: ClientInfo {
                id: "cli".into(),
                mode: mode.into(),
                version: "fuzz".into(),
                platform: "linux".into(),
                ..ClientInfo::default()
            },
            message_watch: Default::default(),
            requests: Default::default(),
        });
        (conn, reader)
    }

    /// Dispatches `method` with `params`; the one answer frame.
    fn answer(&self, method: &str, profile_name: &str, params: &Value) -> Value {
        let (conn, mut reader) = self.conn(profile_name);
        let frame = json!({ "type": "req", "id": "fuzz-1", "method": method, "params": params });
        let frame = frame.to_string();
        // Nested past EDGE_MAX_JSON_DEPTH: refused as a frame, before its id is read.
        let id = match json_depth::nests_deeper_than(&frame, self.edge.config.max_json_depth) {
            true => "invalid",
            false => "fuzz-1",
        };
        let edge = self.edge.clone();
        let frames = self.runtime.block_on(async move {
            let handle = tokio::runtime::Handle::current();
            let before = handle.metrics().num_alive_tasks();
            methods::dispatch(&edge, &conn, &frame);
            let first = tokio::time::timeout(ANSWER_DEADLINE, reader.recv())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer within {ANSWER_DEADLINE:?}"))
                .expect("the outbox is open");
            // The request's task ends: nothing of it stays behind.
            let deadline = tokio::time::Instant::now() + ANSWER_DEADLINE;
            while handle.metrics().num_alive_tasks() > before {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{method}: a task outlived its answer"
                );
                tokio::task::yield_now().await;
            }
            let mut frames = vec![first.into_text()];
            while let Some(more) = reader.try_recv() {
                frames.push(more.into_text());
            }
            frames
        });
        assert_eq!(frames.len(), 1, "{method}: one answer, got {frames:?}");
        check_answer(&frames[0], id)
    }

    fn check(&mut self, method: &'static str, profile_name: &str, params: Value) {
        self.calls += 1;
        if self.calls > CALLS_PER_EDGE {
            let _entered = self.runtime.enter();
            self.edge = Self::edge(&self.runtime);
            self.calls = 0;
        }
        let answer = self.answer(method, profile_name, &params);
        if answer["id"] == "invalid" {
            assert_eq!(answer["error"]["code"], "INVALID_REQUEST", "{answer}");
            return;
        }
        let error = &answer["error"];
        let code = error["code"].as_str();
        let message = error["message"].as_str().unwrap_or_default();
        let (held, _) = profile(profile_name);
        let held: Vec<String> = held.iter().map(|s| s.to_string()).collect();
        let required = methods::required_scope(method, &params);
        if scopes::authorize(required, "operator", &held).is_err() {
            assert_eq!(
                code,
                Some("FORBIDDEN"),
                "{method} without its scope: {answer}"
            );
            return;
        }
        let declared = methods::param_keys(method);
        if let Some(extra) = message
            .split_once("must NOT have additional properties (")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
        {
            assert!(
                !declared.contains(&extra),
                "{method}: declared key {extra:?} refused: {message}"
            );
        }
        let passed = answer["ok"] == true || code == Some("UNAVAILABLE");
        if !passed || declared.is_empty() {
            return;
        }
        let object = params
            .as_object()
            .unwrap_or_else(|| panic!("{method}: non-object params accepted: {params}"));
        for key in object.keys() {
            let marker = method == "chat.send" && profile_name == "ui" && key == RECONNECT_MARKER;
            assert!(
                declared.contains(&key.as_str()) || marker,
                "{method}: undeclared key {key:?} accepted"
            );
        }
        let short_id =
            method == "chat.startup" && object.get("shortId").is_some_and(|v| !v.is_null());
        for (_, key, min, max) in RANGES.iter().filter(|(m, ..)| *m == method) {
            let Some(value) = object.get(*key).filter(|v| !v.is_null()) else {
                continue;
            };
            // With a shortId, chat.startup reads the store before its limits.
            if short_id && code == Some("UNAVAILABLE") {
                continue;
            }
            assert!(
                value.as_u64().is_some_and(|n| (*min..=*max).contains(&n)),
                "{method}: {key} = {value} accepted outside {min}..{max}"
            );
        }
        let mut extra = object.clone();
        extra.insert(UNKNOWN_KEY.into(), json!(1));
        let refused = self.answer(method, profile_name, &Value::Object(extra));
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.ends_with(&format!(
                    "must NOT have additional properties ({UNKNOWN_KEY})"
                ))),
            "{method}: an unknown key not refused: {refused}"
        );
    }
}

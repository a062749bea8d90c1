//! [`check_method_params`]: one served method's params through the real
//! dispatch and handler.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{Value, json};

use super::{UNKNOWN_KEY, check_answer};
use crate::auth::scopes::{self, ADMIN, APPROVALS, QUESTIONS, READ, WRITE};
use crate::config::EdgeConfig;
use crate::events::Events;
use crate::methods::{self, SERVED_METHODS};
use crate::protocol::json_depth;
use crate::state::connection::{ClientInfo, Conn, Outbox, OutboxReader};
use crate::state::{Backends, Edge};

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
    events: Arc<Events>,
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
            events: Arc::default(),
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
        let (edge, events) = (self.edge.clone(), self.events.clone());
        let frames = self.runtime.block_on(async move {
            let handle = tokio::runtime::Handle::current();
            let before = handle.metrics().num_alive_tasks();
            methods::dispatch(&edge, &events, &conn, &frame);
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
            self.events = Arc::default();
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
        let required = methods::required_access(method, &params);
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
            .split_once("params: must NOT have additional properties (")
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

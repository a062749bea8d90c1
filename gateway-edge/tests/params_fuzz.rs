//! No client input may panic or wedge the edge (issue 9): a property test
//! that gives every method in `SERVED_METHODS` random values for each of
//! its params (`methods::param_keys`): numbers at the edges (huge,
//! negative, fractional, past 2^53 and 2^64), wrong types, long and tricky
//! strings, real ids, nested values; sometimes an unknown key or params
//! that are not an object. Every request must get its `res` frame (ok, or
//! `ok: false` with a known code and a message; never one carrying a broken
//! backend transport), the connection must stay open and answer `health`
//! afterwards, and no thread of the process may panic (the store, the
//! coordinator and the edge all run in it). Deterministic: a fixed seed;
//! `PARAMS_FUZZ_CASES` and `PARAMS_FUZZ_SEED` override.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clawgate_system_tests::proto_fuzz::{env_or, record_panics, seeded_runner, take_panics};
use common::*;
use futures::{SinkExt, StreamExt};
use gateway_edge::methods::{SERVED_METHODS, param_keys};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use run_coordinator::config::CoordinatorConfig;
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

const SEED: u64 = 0xed9e_9a7a_f022_2026;
const CASES_PER_METHOD: u32 = 64;
const STEP: Duration = Duration::from_secs(10);

fn numbers() -> BoxedStrategy<Value> {
    let edges = vec![
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(1000),
        json!(1001),
        json!(86_400_000),
        json!(172_800_001),
        json!(i32::MAX),
        json!(u32::MAX),
        json!(1u64 << 53),
        json!((1u64 << 53) + 1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX >> 1),
        json!((u64::MAX >> 1) + 1),
        json!(u64::MAX),
        json!(0.5),
        json!(-0.5),
        json!(1.5),
        json!(1000.0),
        json!(-0.0),
        json!(1e308),
        json!(-1e308),
        json!(5e-324),
    ];
    prop_oneof![
        3 => select(edges),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(Value::from),
    ]
    .boxed()
}

fn strings(dictionary: Vec<String>) -> BoxedStrategy<Value> {
    let tricky: Vec<String> = [
        "",
        " ",
        "\0",
        "\u{7f}",
        "\n",
        "é",
        "😀",
        "\u{202e}",
        "main",
        "global",
        "agent:",
        "agent:main:",
        "agent:a b:c",
        "reset",
        "new",
        "interrupt",
        "steer",
        "null",
        "{}",
        "00000000-0000-0000-0000-000000000000",
        "not-a-uuid",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let long = (
        select(vec![128usize, 129, 256, 257, 512, 513, 100_000]),
        select(vec!['x', 'é', '😀']),
    )
        .prop_map(|(n, c)| Value::String(std::iter::repeat_n(c, n).collect()));
    prop_oneof![
        3 => select(dictionary).prop_map(Value::String),
        3 => select(tricky).prop_map(Value::String),
        1 => "[a-zA-Z0-9:_.-]{1,16}".prop_map(Value::String),
        1 => any::<String>().prop_map(Value::String),
        1 => long,
    ]
    .boxed()
}

/// Any JSON value, scalars most of the time.
fn values(dictionary: Vec<String>) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        3 => numbers(),
        3 => strings(dictionary),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Well-formed params for each method (what the mutated cases start
/// from): the first is answered ok, the others may be refused (the key of
/// the long finished run reused); `session_id` is the seeded session's.
fn examples(method: &str, session_id: &str) -> Vec<Value> {
    let reused = match method {
        "agent" => Some(json!({ "message": "another question", "idempotencyKey": "edge-done" })),
        "chat.send" => Some(json!({
            "sessionKey": "main", "message": "another question", "idempotencyKey": "edge-done",
        })),
        _ => None,
    };
    std::iter::once(example(method, session_id))
        .chain(reused)
        .collect()
}

fn example(method: &str, session_id: &str) -> Value {
    match method {
        "agent" => json!({
            "message": "hi", "idempotencyKey": "edge-agent", "sessionKey": "main",
            "timeout": 60, "label": "fuzz",
        }),
        "agent.wait" => json!({ "runId": "edge-done", "timeoutMs": 10 }),
        "chat.send" => json!({
            "sessionKey": "main", "message": "hi", "idempotencyKey": "edge-send",
            "timeoutMs": 60_000, "queueMode": "steer",
        }),
        "chat.abort" => json!({ "sessionKey": "main", "runId": "edge-done" }),
        "sessions.abort" => json!({ "key": "main", "runId": "edge-done", "clearQueued": true }),
        "sessions.messages.subscribe" => json!({ "key": "main", "includeApprovals": true }),
        "sessions.messages.unsubscribe" => json!({ "key": "main" }),
        "users.prefs.set" => json!({ "entries": { "ui.theme": "dark" } }),
        "sessions.patch" => json!({
            "key": "main", "label": "fuzzed", "pinned": true, "unread": false,
            "thinkingLevel": "off", "expectedMarkedUnreadAt": null,
        }),
        "sessions.create" => json!({ "key": "agent:main:fuzz-created", "displayName": "fuzz" }),
        "chat.history" => json!({
            "sessionKey": "main", "limit": 10, "maxChars": 1000, "sessionId": session_id,
            "messageId": format!("{session_id}:1"), "maxBytes": 262_144,
        }),
        "chat.startup" => json!({
            "sessionKey": "main", "limit": 80, "maxBytes": 262_144, "inputRunIds": ["edge-done"],
        }),
        "sessions.describe" => json!({ "key": "main", "includeLastMessage": true }),
        "sessions.resolve" => json!({ "key": "main" }),
        "models.list" => json!({ "view": "configured" }),
        "commands.list" => json!({ "agentId": "main", "scope": "text", "includeArgs": false }),
        "sessions.list" => json!({
            "limit": 10, "activeMinutes": 60, "search": "main", "configuredAgentsOnly": true,
            "includeGlobal": true, "includeUnknown": true, "archived": "all", "offset": 0,
        }),
        "sessions.reset" => json!({ "key": "agent:main:other", "reason": "new" }),
        "sessions.delete" => json!({ "key": "agent:main:other", "deleteTranscript": true }),
        "runs.resume" => json!({ "runId": "edge-done", "fromSeq": 0 }),
        "tools.github.status" => json!({ "agentId": "main", "selectedScope": "system" }),
        "config.schema.lookup" => json!({ "path": "plugins.entries.memory.config" }),
        "sessions.get" => json!({ "key": "main", "limit": 5, "agentId": "main" }),
        "migrations.memory.plan" => json!({ "agentId": "main", "overwrite": true }),
        "chat.message.get" => json!({ "sessionKey": "main", "messageId": "x:1", "maxChars": 10 }),
        "sessions.patchMany" => json!({
            "targets": [{ "key": "main", "expectedMarkedUnreadAt": null }],
            "patch": { "pinned": true, "label": "many" },
        }),
        "sessions.compact" => json!({ "key": "main", "agentId": "main", "maxLines": 100 }),
        "sessions.usage" => json!({
            "key": "main", "startDate": "2026-01-01", "endDate": "2026-12-31", "mode": "specific",
            "utcOffset": "UTC+5:30", "limit": 10, "includeContextWeight": false,
        }),
        "sessions.usage.timeseries" => json!({ "key": "main" }),
        "sessions.usage.logs" => json!({ "key": "main", "limit": 10 }),
        "sessions.preview" => {
            json!({ "keys": ["main", "agent:main:other"], "limit": 3, "maxChars": 100 })
        }
        _ => json!({}),
    }
}

/// Params for `method`: each of its keys set (to anything) or not, at
/// times an unknown key too, or params that are not an object at all; half
/// of the cases are `example` with each key replaced or removed with
/// probability 0.3.
fn params(method: &str, dictionary: Vec<String>, examples: Vec<Value>) -> BoxedStrategy<Value> {
    let keys = param_keys(method);
    let mutations = prop::collection::vec(
        (
            prop::bool::weighted(0.3),
            prop::option::weighted(0.7, values(dictionary.clone())),
        ),
        keys.len(),
    );
    let mutated = (select(examples), mutations).prop_map(move |(example, mutations)| {
        let mut params = example.as_object().cloned().unwrap_or_default();
        for (key, (mutate, value)) in keys.iter().zip(mutations) {
            match (mutate, value) {
                (false, _) => {}
                (true, Some(value)) => {
                    params.insert((*key).to_owned(), value);
                }
                (true, None) => {
                    params.remove(*key);
                }
            }
        }
        Value::Object(params)
    });
    prop_oneof![1 => fresh_params(method, dictionary), 1 => mutated].boxed()
}

fn fresh_params(method: &str, dictionary: Vec<String>) -> BoxedStrategy<Value> {
    let keys = param_keys(method);
    let fields = prop::collection::vec(
        prop::option::weighted(0.7, values(dictionary.clone())),
        keys.len(),
    );
    let object = (
        fields,
        prop::option::weighted(0.1, values(dictionary.clone())),
    )
        .prop_map(move |(fields, extra)| {
            let mut map: Map<String, Value> = keys
                .iter()
                .zip(fields)
                .filter_map(|(key, value)| Some(((*key).to_owned(), value?)))
                .collect();
            if let Some(extra) = extra {
                map.insert("__fuzz".into(), extra);
            }
            Value::Object(map)
        });
    prop_oneof![9 => object, 1 => values(dictionary)].boxed()
}

/// Codes the protocol answers a request with.
const KNOWN_CODES: &[&str] = &["INVALID_REQUEST", "UNAVAILABLE", "FORBIDDEN"];

/// Why `res` is not a clean answer to a request with these params.
fn check_answer(res: &Value, listed_keys_only: bool) -> Result<(), String> {
    let keys_ok = res.as_object().is_some_and(|o| {
        o.keys()
            .all(|k| ["type", "id", "ok", "payload", "error"].contains(&k.as_str()))
    });
    if !keys_ok || !res["ok"].is_boolean() {
        return Err(format!("not a res frame: {res}"));
    }
    if res["ok"] == true {
        return Ok(());
    }
    let error = &res["error"];
    let code = error["code"].as_str().unwrap_or("");
    let message = error["message"].as_str().unwrap_or("");
    if !KNOWN_CODES.contains(&code) || message.is_empty() {
        return Err(format!("not the protocol's error shape: {error}"));
    }
    for broken in [
        "h2 protocol error",
        "transport error",
        "panicked",
        "INTERNAL",
    ] {
        if message.contains(broken) {
            return Err(format!("a backend broke: {error}"));
        }
    }
    // Only the top level's keys are listed: a nested object's refusal
    // names its path (`params: /patch must NOT…`).
    if listed_keys_only && message.contains("params: must NOT have additional properties") {
        return Err(format!("a key param_keys lists was refused: {error}"));
    }
    Ok(())
}

/// The `res` frame with `id`, skipping everything else; `Err` if the
/// connection closes or nothing comes in time.
async fn response(client: &mut Client, id: &str) -> Result<Value, String> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let message = tokio::time::timeout_at(deadline, client.ws.next())
            .await
            .map_err(|_| format!("no answer to {id} within {STEP:?}"))?;
        match message {
            Some(Ok(Message::Text(text))) => {
                let frame: Value =
                    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
                if frame["type"] == "res" && frame["id"] == id {
                    return Ok(frame);
                }
            }
            Some(Ok(Message::Close(frame))) => return Err(format!("closed: {frame:?}")),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("the socket failed: {e}")),
            None => return Err("the socket ended".into()),
        }
    }
}

async fn request(
    client: &mut Client,
    id: &str,
    method: &str,
    params: &Value,
) -> Result<Value, String> {
    let frame = json!({ "type": "req", "id": id, "method": method, "params": params });
    client
        .ws
        .send(Message::text(frame.to_string()))
        .await
        .map_err(|e| format!("sending: {e}"))?;
    response(client, id).await
}

#[test]
fn every_method_answers_any_params_cleanly() {
    record_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Waits short, so a generated agent.wait is over in milliseconds.
    let config = CoordinatorConfig {
        default_wait: Duration::from_millis(20),
        max_wait: Duration::from_millis(50),
        cancel_settle: Duration::from_millis(50),
        max_executing: 10_000,
        ..CoordinatorConfig::default()
    };
    let (system, mut client, dictionary, session_id) = runtime.block_on(async {
        let system = system_with(config).await;
        let (url, _edge) = system.edge(system.edge_config()).await;
        let mut client = Client::connect(&url, &[ADMIN]).await;
        // A finished run with a long answer (a refusal about it carries its
        // snapshot) and its session, for ids that exist.
        let long = "a long question ".repeat(4096);
        let sent = client
            .request(
                "chat.send",
                json!({ "sessionKey": "main", "message": long, "idempotencyKey": "edge-done" }),
            )
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
        // Waits are capped short here: ask until the run is over.
        wait_for("edge-done to finish", STEP, async || {
            let waited = client
                .request(
                    "agent.wait",
                    json!({ "runId": "edge-done", "timeoutMs": 50 }),
                )
                .await;
            if waited["payload"]["status"] == "ok" {
                Ok(())
            } else {
                Err(waited.to_string())
            }
        })
        .await;
        let history = client
            .request("chat.history", json!({ "sessionKey": "main" }))
            .await;
        let session_id = history["payload"]["sessionId"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        // The examples are valid: each is answered ok.
        for method in SERVED_METHODS {
            let res = client.request(method, example(method, &session_id)).await;
            assert_eq!(res["ok"], true, "the example of {method}: {res}");
        }
        let dictionary = vec![
            "main".to_owned(),
            "agent:main:main".into(),
            "agent:main:other".into(),
            "edge-done".into(),
            "edge-agent".into(),
            session_id.clone(),
        ];
        (system, client, dictionary, session_id)
    });

    let cases = env_or("PARAMS_FUZZ_CASES", CASES_PER_METHOD);
    let seed = env_or("PARAMS_FUZZ_SEED", SEED);
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut outcomes: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let mut n = 0u64;
    for method in SERVED_METHODS {
        let mut runner = seeded_runner(cases, 32, seed, method);
        let codes = std::cell::RefCell::new(BTreeMap::<String, usize>::new());
        let client_cell = std::cell::RefCell::new(&mut client);
        let counter = std::cell::Cell::new(n);
        let strategy = params(method, dictionary.clone(), examples(method, &session_id));
        let result = runner.run(&strategy, |params| {
            let id = counter.get();
            counter.set(id + 1);
            let mut client = client_cell.borrow_mut();
            let checked: Result<(), String> = runtime.block_on(async {
                let only_listed = params
                    .as_object()
                    .is_some_and(|o| o.keys().all(|k| param_keys(method).contains(&k.as_str())));
                let res = request(&mut client, &format!("p{id}"), method, &params).await?;
                check_answer(&res, only_listed)?;
                let code = res["error"]["code"].as_str().unwrap_or("ok").to_owned();
                *codes.borrow_mut().entry(code).or_default() += 1;
                let health = request(&mut client, &format!("h{id}"), "health", &json!({})).await?;
                if health["ok"] != true {
                    return Err(format!("health afterwards: {health}"));
                }
                Ok(())
            });
            let panics = take_panics();
            let checked = match (checked, panics.is_empty()) {
                (Ok(()), true) => Ok(()),
                (checked, _) => Err(format!(
                    "{}{}",
                    checked.err().unwrap_or_default(),
                    panics
                        .iter()
                        .map(|p| format!("\n  {p}"))
                        .collect::<String>()
                )),
            };
            checked.map_err(|why| {
                let shown: String = params.to_string().chars().take(600).collect();
                TestCaseError::fail(format!("{why}\n  params: {shown}"))
            })
        });
        n = counter.get();
        if let Err(e) = result {
            failures.push(format!("{method} (seed {seed}): {e}"));
        }
        outcomes.insert((*method).to_owned(), codes.into_inner());
        if !failures.is_empty() && client_is_closed(&mut client, &runtime) {
            break;
        }
    }
    eprintln!("params fuzz: {:?}", started.elapsed());
    for (method, codes) in &outcomes {
        eprintln!("{method}: {codes:?}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    system.stop.cancel();
}

/// After a failure: whether the connection is gone (then the remaining
/// methods cannot be fuzzed on it).
fn client_is_closed(client: &mut Client, runtime: &tokio::runtime::Runtime) -> bool {
    runtime
        .block_on(request(client, "closed?", "health", &json!({})))
        .is_err()
}

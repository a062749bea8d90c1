//! The CI smoke run of the edge's fuzz targets (issue 14), on the stable
//! toolchain: every committed seed of `fuzz/seeds/{frame,connect,
//! method_params}/` (real client frames from `fixtures/captures/`, see
//! `fuzz/seeds.py`), then a few thousand deterministic mutations of them,
//! through the same `gateway_edge::fuzzing::check_*` functions the
//! libFuzzer targets run (`fuzz/fuzz_targets/`). Each check panics when
//! the edge panics or answers something ill-formed (see `src/fuzzing.rs`);
//! a failure prints the input, to add to the seeds and replay.
//!
//! The mutations are byte-level (flips, interesting bytes, insertions,
//! deletions, splices of other seeds, dictionary tokens) and structural
//! (a JSON value of the input replaced by an edge value, keys added and
//! removed, and for the method target every served method's declared keys
//! with random values, so each method is driven whatever the seeds hold).
//! `FUZZ_CORPUS_MUTATIONS` and `FUZZ_CORPUS_SEED` override the count and
//! the seed.

use std::path::Path;

use clawgate_system_tests::fuzz_seeds::{XorShiftStar as Rng, env_or, seeds};
use gateway_edge::fuzzing::{check_connect, check_frame, check_method_params, method_input};
use gateway_edge::methods::{SERVED_METHODS, param_keys};
use serde_json::{Map, Value, json};

const SEED: u64 = 0xf022_0014_c0de_2026;

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e999",
    "18446744073709551616",
    "9007199254740993",
    "0.5",
    "\"\"",
    "\\u0000",
    "\\ud800",
    "é",
    "😀",
    "\"type\"",
    "\"req\"",
    "\"id\"",
    "\"method\"",
    "\"params\"",
    "\"traceparent\"",
    "\n",
];

/// An edge value of any JSON type.
fn edge_value(rng: &mut Rng) -> Value {
    let choices = [
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(-1),
        json!(1000),
        json!(1001),
        json!(1024),
        json!(0.5),
        json!(-0.0),
        json!(1e300),
        json!(u32::MAX),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(u64::MAX >> 1),
        json!((u64::MAX >> 1) + 1),
        json!(""),
        json!(" "),
        json!("main"),
        json!("agent:main:main"),
        json!("agent:"),
        json!("/stop"),
        json!("/new hi"),
        json!("/queue steer"),
        json!("/queue nope"),
        json!("global"),
        json!("x\u{0}y"),
        json!("😀é\u{202e}"),
        json!("0123abcd"),
        json!("00000000-0000-0000-0000-000000000000:1"),
        json!("a:0"),
        json!("data:text/plain;base64,aGk="),
        json!("not base64!"),
        json!("operator.admin"),
        json!("x".repeat(600)),
        json!([]),
        json!(["a", "a"]),
        json!([1, "b", null]),
        json!({}),
        json!({ "key": "main" }),
        json!([{ "mimeType": "text/plain", "content": "aGk=" }]),
        json!([{ "content": "data:image/png;base64,AAAA" }]),
    ];
    rng.pick(&choices).clone()
}

/// Replaces, removes or adds something at a random place of `value`.
fn mutate_value(value: &mut Value, rng: &mut Rng, keys: &[&str], depth: usize) {
    let descend = depth < 6 && rng.chance(60);
    match value {
        Value::Object(map) if descend && !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
            match rng.below(4) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let new_key = if keys.is_empty() || rng.chance(20) {
                        format!("k{}", rng.below(4))
                    } else {
                        rng.pick(keys).to_string()
                    };
                    map.insert(new_key, edge_value(rng));
                }
                _ => mutate_value(map.get_mut(&key).unwrap(), rng, keys, depth + 1),
            }
        }
        Value::Array(items) if descend && !items.is_empty() => {
            let at = rng.below(items.len());
            match rng.below(3) {
                0 => {
                    items.remove(at);
                }
                1 => items.push(edge_value(rng)),
                _ => mutate_value(&mut items[at], rng, keys, depth + 1),
            }
        }
        Value::Object(map) if rng.chance(50) => {
            let key = match keys.is_empty() {
                true => format!("k{}", rng.below(4)),
                false => rng.pick(keys).to_string(),
            };
            map.insert(key, edge_value(rng));
        }
        other => *other = edge_value(rng),
    }
}

/// A byte-level mutation of `data`, `others` giving splices.
fn mutate_bytes(data: &[u8], others: &[(String, Vec<u8>)], rng: &mut Rng) -> Vec<u8> {
    let mut out = data.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = *rng.pick(&[0, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'\n', b' ']);
            }
            2 => out.insert(at, rng.next_u64() as u8),
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 => {
                let token = rng.pick(TOKENS).as_bytes();
                out.splice(at..at, token.iter().copied());
            }
            5 => {
                let (_, other) = rng.pick(others);
                let from = rng.below(other.len());
                let len = rng.below(other.len() - from + 1).min(64);
                out.splice(at..at, other[from..from + len].iter().copied());
            }
            _ if !out.is_empty() => out.truncate(at),
            _ => out.push(b'{'),
        }
    }
    out
}

/// A structural mutation of a JSON input (`None`: it is not JSON).
fn mutate_json(data: &[u8], rng: &mut Rng, keys: &[&str]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(data).ok()?;
    for _ in 0..1 + rng.below(3) {
        mutate_value(&mut value, rng, keys, 0);
    }
    Some(value.to_string().into_bytes())
}

/// Seeds, then `mutations` mutated inputs, through `check`; a panic names
/// the input.
fn run(target: &str, mutations: u64, keys: &[&str], check: fn(&[u8])) {
    let seeds = seeds(target);
    for (name, data) in &seeds {
        checked(check, data, &format!("seed {target}/{name}"));
    }
    let count = env_or("FUZZ_CORPUS_MUTATIONS", mutations);
    let mut rng = Rng(env_or("FUZZ_CORPUS_SEED", SEED) | 1);
    for case in 0..count {
        let (name, seed) = rng.pick(&seeds);
        let data = match rng.chance(50) {
            true => mutate_json(seed, &mut rng, keys).unwrap_or_else(|| seed.clone()),
            false => mutate_bytes(seed, &seeds, &mut rng),
        };
        checked(check, &data, &format!("mutation {case} of {target}/{name}"));
    }
}

fn checked(check: fn(&[u8]), data: &[u8], what: &str) {
    let outcome = std::panic::catch_unwind(|| check(data));
    if let Err(panic) = outcome {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!(
            "{what} failed: {message}\ninput: {:?}",
            String::from_utf8_lossy(data)
        );
    }
}

const FRAME_KEYS: &[&str] = &["type", "id", "method", "params", "traceparent"];

#[test]
fn frame_seeds_and_mutations() {
    run("frame", 6000, FRAME_KEYS, check_frame);
}

const CONNECT_KEYS: &[&str] = &[
    "minProtocol",
    "maxProtocol",
    "client",
    "caps",
    "role",
    "scopes",
    "device",
    "auth",
    "id",
    "mode",
    "version",
    "platform",
    "signedAt",
    "nonce",
    "token",
    "deviceToken",
    "modelCatalog",
    "permissions",
];

#[test]
fn connect_seeds_and_mutations() {
    run("connect", 4000, CONNECT_KEYS, check_connect);
}

/// Every method's declared keys, with the profile names.
fn method_keys() -> Vec<&'static str> {
    let mut keys: Vec<&str> = SERVED_METHODS
        .iter()
        .flat_map(|m| param_keys(m).iter().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The method target: seeds and mutations of them (the header switched to
/// another method or profile now and then), then params made of random
/// declared keys for every served method.
#[test]
fn method_params_seeds_and_mutations() {
    let seeds = seeds("method_params");
    for (name, data) in &seeds {
        checked(
            check_method_params,
            data,
            &format!("seed method_params/{name}"),
        );
    }
    let keys = method_keys();
    let profiles = [
        None,
        Some("write"),
        Some("read"),
        Some("none"),
        Some("ui"),
        Some("approvals"),
    ];
    let count = env_or("FUZZ_CORPUS_MUTATIONS", 3000);
    let mut rng = Rng(env_or("FUZZ_CORPUS_SEED", SEED) | 1);
    for case in 0..count {
        let (name, seed) = rng.pick(&seeds);
        let newline = seed.iter().position(|&b| b == b'\n').unwrap_or(0);
        let (head, body) = (
            String::from_utf8_lossy(&seed[..newline]),
            &seed[newline + 1..],
        );
        let (mut method, mut profile) = match head.split_once(' ') {
            Some((m, p)) => (m.to_owned(), Some(p.to_owned())),
            None => (head.into_owned(), None),
        };
        if rng.chance(15) {
            method = rng.pick(SERVED_METHODS).to_string();
        }
        if rng.chance(15) {
            profile = rng.pick(&profiles).map(str::to_owned);
        }
        let data = match rng.below(3) {
            0 => {
                let declared = param_keys(&method);
                let mut params: Value = serde_json::from_slice(body).unwrap_or(json!({}));
                for _ in 0..1 + rng.below(3) {
                    let pool = if declared.is_empty() || rng.chance(10) {
                        &keys[..]
                    } else {
                        declared
                    };
                    mutate_value(&mut params, &mut rng, pool, 0);
                }
                method_input(&method, profile.as_deref(), &params)
            }
            1 => mutate_bytes(seed, &seeds, &mut rng),
            _ => {
                let mut params: Value = serde_json::from_slice(body).unwrap_or(json!({}));
                mutate_value(&mut params, &mut rng, &keys, 0);
                method_input(&method, profile.as_deref(), &params)
            }
        };
        checked(
            check_method_params,
            &data,
            &format!("mutation {case} of method_params/{name}"),
        );
    }
    // Every served method, with random values for a random part of its keys.
    for (index, method) in SERVED_METHODS.iter().enumerate() {
        for round in 0..8 {
            let mut params = Map::new();
            for key in param_keys(method) {
                if rng.chance(40) {
                    params.insert(key.to_string(), edge_value(&mut rng));
                }
            }
            let profile = rng.pick(&profiles);
            let data = method_input(method, *profile, &Value::Object(params));
            checked(
                check_method_params,
                &data,
                &format!("method {index} ({method}) round {round}"),
            );
        }
    }
}

/// Writes `fuzz/dicts/method_params.dict` (libFuzzer's dictionary: every
/// served method and every declared key) for `fuzz/run.sh`.
#[test]
#[ignore = "writes fuzz/dicts/; run by fuzz/seeds.py"]
fn write_method_dictionary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/dicts");
    std::fs::create_dir_all(&dir).unwrap();
    let mut lines = vec![
        "# Generated by gateway-edge/tests/fuzz_corpus.rs (write_method_dictionary).".to_owned(),
    ];
    for word in SERVED_METHODS.iter().copied().chain(method_keys()) {
        lines.push(dict_entry(&format!("\"{word}\"")));
    }
    for method in SERVED_METHODS {
        lines.push(dict_entry(&format!("{method}\n")));
    }
    std::fs::write(dir.join("method_params.dict"), lines.join("\n") + "\n").unwrap();
}

/// A libFuzzer dictionary line: `"…"` with `\\`, `\"` and `\xNN` escapes.
fn dict_entry(word: &str) -> String {
    let mut line = String::from("\"");
    for byte in word.bytes() {
        match byte {
            b'\\' | b'"' => {
                line.push('\\');
                line.push(byte as char);
            }
            0x20..=0x7e => line.push(byte as char),
            _ => line.push_str(&format!("\\x{byte:02X}")),
        }
    }
    line.push('"');
    line
}

// ---------------------------------------------------------------------------
// Regressions: inputs that broke an oracle once (also in the seeds).
// ---------------------------------------------------------------------------

/// A slash command sent with `chat.send` skipped the `timeoutMs` check
/// (the command ran before it): `-5` was accepted. Now refused.
#[test]
fn slash_command_sends_check_their_timeout() {
    for message in ["/stop", "/new hi", "/queue collect"] {
        let params = json!({
            "sessionKey": "main", "message": message, "idempotencyKey": "k1", "timeoutMs": -5,
        });
        check_method_params(&method_input("chat.send", None, &params));
    }
}

/// Params nested past `EDGE_MAX_JSON_DEPTH` (64) but within the parser's
/// 128: the frame is refused before its id is read (answered as
/// `invalid`), for any method; a frame just within the bound is not.
#[test]
fn deep_params_are_refused_as_frames() {
    for depth in [60, 62, 63, 64, 100, 126] {
        let mut params = json!({ "sessionKey": "main" });
        for _ in 0..depth {
            params = json!({ "key": params });
        }
        for method in ["chat.history", "health", "sessions.list"] {
            check_method_params(&method_input(method, None, &params));
        }
        let frame = json!({ "type": "req", "id": "1", "method": "health", "params": params });
        check_frame(frame.to_string().as_bytes());
    }
}

/// The nesting bound counts what the parser reads: duplicate keys
/// included, though the parsed value keeps only the last of them (the
/// frame target's oracle once counted the parsed value).
#[test]
fn duplicate_keys_count_for_the_nesting_bound() {
    let frame = r#"{"type":"req","id":"1","method":"health","params":{"a":[[[1]]],"a":1}}"#;
    check_frame(frame.as_bytes());
    // The frame, params, then `[[[`: five levels.
    assert!(gateway_edge::protocol::json_depth::nests_deeper_than(
        frame, 4
    ));
    assert!(!gateway_edge::protocol::json_depth::nests_deeper_than(
        frame, 5
    ));
}

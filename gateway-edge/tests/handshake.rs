//! The `connect` handshake as a client sees it (spec §2.1–2.4, §2.7, §2.8):
//! the challenge, `hello-ok`, every rejection with its `res` and close
//! frame, the pre-auth limits (timeout, frame size, per-IP socket budget),
//! and the plain HTTP probes. Every wait is bounded.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clawgate_system_tests::client::with_test_token;
use common::*;
use futures::{SinkExt, StreamExt};
use gateway_edge::EdgeConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, Message};

/// The longest any single step may take.
const WAIT: Duration = Duration::from_secs(5);

/// What the server sent after the challenge, up to and including its close.
#[derive(Debug)]
struct Ending {
    frames: Vec<Value>,
    close: (u16, String),
}

async fn open(url: &str) -> (Ws, Value) {
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade in time")
        .expect("websocket upgrade");
    let challenge = next_json(&mut ws).await.expect("a challenge");
    assert_eq!(challenge["event"], "connect.challenge", "{challenge}");
    (ws, challenge)
}

/// The next text frame as JSON; `None` when the socket closes instead.
async fn next_json(ws: &mut Ws) -> Option<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a frame within the deadline");
        match message {
            Some(Ok(Message::Text(text))) => {
                return Some(serde_json::from_str(&text).expect("frames are JSON"));
            }
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            Some(Ok(_)) => {}
        }
    }
}

/// Reads until the server closes (bounded); collects the frames before it.
async fn until_close(ws: &mut Ws) -> Ending {
    let deadline = Instant::now() + WAIT;
    let mut frames = Vec::new();
    loop {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("the server did not close in time; got {frames:?}"));
        match message {
            Some(Ok(Message::Text(text))) => {
                frames.push(serde_json::from_str(&text).expect("frames are JSON"));
            }
            Some(Ok(Message::Close(frame))) => {
                let close = frame.map_or((1005, String::new()), |f| {
                    (f.code.into(), f.reason.to_string())
                });
                return Ending { frames, close };
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => {
                return Ending {
                    frames,
                    close: (1006, String::new()),
                };
            }
        }
    }
}

/// Opens a socket, reads the challenge, sends `first`, reads to the close.
async fn first_frame(url: &str, first: Message) -> Ending {
    let (mut ws, _) = open(url).await;
    ws.send(first).await.unwrap();
    until_close(&mut ws).await
}

fn connect_frame(params: Value) -> Message {
    Message::text(json!({"type":"req","id":"c-1","method":"connect","params":params}).to_string())
}

/// `connect` with `params`; the socket and the response.
async fn handshake(url: &str, params: Value) -> (Ws, Value, Value) {
    let (mut ws, challenge) = open(url).await;
    ws.send(connect_frame(params)).await.unwrap();
    let res = next_json(&mut ws).await.expect("a connect response");
    (ws, challenge, res)
}

/// Asserts a rejected `connect`: exactly one `res` (the whole frame, so no
/// extra keys), then the close frame.
fn assert_rejected(ending: &Ending, error: Value, close_code: u16, close_reason: &str) {
    assert_eq!(
        ending.frames,
        vec![json!({"type":"res","id":"c-1","ok":false,"error":error})],
        "{ending:?}"
    );
    assert_eq!(
        ending.close,
        (close_code, close_reason.to_owned()),
        "{ending:?}"
    );
}

/// Asserts a close with no `res` before it.
fn assert_closed_silently(ending: &Ending, code: u16, reason: &str) {
    assert!(ending.frames.is_empty(), "no response expected: {ending:?}");
    assert_eq!(ending.close, (code, reason.to_owned()), "{ending:?}");
}

fn assert_no_nulls(value: &Value, at: &str) {
    match value {
        Value::Null => panic!("null at {at}"),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                assert_no_nulls(item, &format!("{at}/{i}"));
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                assert_no_nulls(item, &format!("{at}/{key}"));
            }
        }
        _ => {}
    }
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn host_of(url: &str) -> &str {
    url.trim_start_matches("ws://")
}

async fn start(config: impl FnOnce(&mut EdgeConfig)) -> (Sandbox, String) {
    let system = system().await;
    let mut edge_config = system.edge_config();
    config(&mut edge_config);
    let (url, _) = system.edge(edge_config).await;
    (system, url)
}

// ---------------------------------------------------------------------------
// The challenge and hello-ok
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_challenge_has_a_fresh_nonce_and_ts_and_no_seq() {
    let (system, url) = start(|_| {}).await;
    let (_ws1, first) = open(&url).await;
    let (_ws2, second) = open(&url).await;
    for challenge in [&first, &second] {
        assert_eq!(keys(challenge), ["event", "payload", "type"], "{challenge}");
        assert_eq!(challenge["type"], "event");
        assert!(challenge.get("seq").is_none());
        assert!(challenge.get("stateVersion").is_none());
        let nonce = challenge["payload"]["nonce"].as_str().expect("nonce");
        uuid::Uuid::parse_str(nonce).expect("the nonce is a uuid");
        let ts = challenge["payload"]["ts"].as_i64().expect("integer ts");
        assert!(
            (ts - now_ms()).abs() < 60_000,
            "ts {ts} is the server clock"
        );
    }
    assert_ne!(first["payload"]["nonce"], second["payload"]["nonce"]);
    system.stop.cancel();
}

/// The bootId a fresh connection to `url` is told.
async fn res_boot_id(url: &str) -> Value {
    let (_ws, _, res) = handshake(url, connect_params(&["operator.read"])).await;
    res["payload"]["server"]["bootId"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_ok_has_every_required_field_and_no_null() {
    let (system, url) = start(|_| {}).await;
    let (_ws, _, res) = handshake(&url, connect_params(&["operator.admin"])).await;
    assert_eq!(keys(&res), ["id", "ok", "payload", "type"], "{res}");
    assert_eq!(res["type"], "res");
    assert_eq!(res["id"], "c-1");
    assert_eq!(res["ok"], true);
    assert_no_nulls(&res, "");
    let hello = &res["payload"];
    assert_eq!(hello["type"], "hello-ok");
    assert_eq!(hello["protocol"], 4);
    assert!(!hello["server"]["version"].as_str().unwrap().is_empty());
    let conn_id = hello["server"]["connId"].as_str().expect("connId");
    assert!(!conn_id.is_empty());

    let methods: Vec<&str> = hello["features"]["methods"]
        .as_array()
        .expect("features.methods")
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // What is listed is served; sessions.resolve (unadvertised in the
    // protocol) and the Control UI side panels are served unlisted.
    let served = gateway_edge::methods::SERVED_METHODS;
    for method in &methods {
        assert!(
            served.contains(method),
            "{method} is advertised, not served"
        );
    }
    for core in [
        "chat.send",
        "chat.startup",
        "chat.history",
        "sessions.list",
        "models.list",
        "sessions.messages.subscribe",
    ] {
        assert!(methods.contains(&core), "{core} is not advertised");
    }
    for hidden in ["sessions.resolve", "cron.list", "config.get", "system.info"] {
        assert!(
            served.contains(&hidden) && !methods.contains(&hidden),
            "{hidden}"
        );
    }
    assert!(hello["features"]["capabilities"].is_array());
    assert_eq!(
        hello["server"]["bootId"],
        res_boot_id(&url).await,
        "one bootId per process"
    );
    let events = hello["features"]["events"].as_array().expect("events");
    for event in ["connect.challenge", "agent", "chat", "tick", "shutdown"] {
        assert!(events.iter().any(|e| e == event), "events lack {event}");
    }

    let snapshot = &hello["snapshot"];
    assert!(snapshot["presence"].is_array());
    assert!(snapshot["health"].is_object(), "health must be an object");
    assert!(snapshot["stateVersion"]["presence"].is_u64());
    assert!(snapshot["stateVersion"]["health"].is_u64());
    assert!(snapshot["uptimeMs"].is_u64());

    assert_eq!(hello["auth"]["role"], "operator");
    assert_eq!(hello["auth"]["scopes"], json!(["operator.admin"]));

    // The policy advertises what the edge enforces.
    let config = system.edge_config();
    let policy = &hello["policy"];
    assert_eq!(policy["maxPayload"], config.max_payload);
    assert_eq!(policy["maxBufferedBytes"], config.max_buffered_bytes);
    assert_eq!(
        policy["tickIntervalMs"],
        config.tick_interval.as_millis() as u64
    );
    assert_eq!(
        policy["attachments"]["maxBytes"],
        config.attachment_max_bytes
    );

    // A second connection gets its own connId.
    let (_ws2, _, res2) = handshake(&url, connect_params(&["operator.read"])).await;
    assert_ne!(res2["payload"]["server"]["connId"], conn_id);
    assert_eq!(res2["payload"]["auth"]["scopes"], json!(["operator.read"]));
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_sent_as_a_binary_frame_is_accepted() {
    let (system, url) = start(|_| {}).await;
    let (mut ws, _) = open(&url).await;
    let frame = json!({"type":"req","id":"c-1","method":"connect","params":connect_params(&[])});
    ws.send(Message::binary(frame.to_string().into_bytes()))
        .await
        .unwrap();
    let res = next_json(&mut ws).await.expect("a response");
    assert_eq!(res["ok"], true, "{res}");
    assert_eq!(res["payload"]["type"], "hello-ok");
    system.stop.cancel();
}

// ---------------------------------------------------------------------------
// Rejections, in the protocol's order (§2.4)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_must_be_connect() {
    let (system, url) = start(|_| {}).await;
    let message = "invalid handshake: first request must be connect";
    for first in [
        json!({"type":"req","id":"c-1","method":"health"}),
        json!({"type":"req","id":"c-1","method":"status","params":{"x":1}}),
        json!({"type":"req","id":"c-1","method":"Connect","params":connect_params(&[])}),
    ] {
        let ending = first_frame(&url, Message::text(first.to_string())).await;
        assert_rejected(
            &ending,
            json!({"code":"INVALID_REQUEST","message":message}),
            1008,
            message,
        );
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_connect_params_are_rejected_with_the_reason() {
    let (system, url) = start(|_| {}).await;
    let valid = connect_params(&["operator.read"]);
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut params = valid.clone();
        edit(&mut params);
        params
    };
    // (params, a fragment the reason must contain)
    let cases: Vec<(Value, &str)> = vec![
        (
            with(&|p| {
                p.as_object_mut().unwrap().remove("client");
            }),
            "client",
        ),
        (
            with(&|p| p["bogus"] = json!(true)),
            "must NOT have additional properties",
        ),
        (
            with(&|p| p["client"]["id"] = json!("ios-node")),
            "/client/id",
        ),
        (
            with(&|p| p["client"]["mode"] = json!("operator")),
            "/client/mode",
        ),
        (with(&|p| p["client"]["extra"] = json!("x")), "additional"),
        (
            with(&|p| {
                p["client"].as_object_mut().unwrap().remove("version");
            }),
            "version",
        ),
        (
            with(&|p| {
                p.as_object_mut().unwrap().remove("minProtocol");
            }),
            "minProtocol",
        ),
        (with(&|p| p["maxProtocol"] = json!("4")), "maxProtocol"),
        (with(&|p| p["minProtocol"] = json!(0)), "minProtocol"),
        (with(&|p| p["scopes"] = json!("operator.read")), "scopes"),
        (with(&|p| p["auth"] = json!("testtoken")), "auth"),
        (with(&|p| p["role"] = json!(7)), "role"),
        (
            with(&|p| p["device"] = json!({"id":"x","publicKey":"y","signature":"z","signedAt":1})),
            "nonce",
        ),
        (json!("not an object"), ""),
        (json!(null), ""),
        (json!([]), ""),
    ];
    for (params, fragment) in cases {
        let ending = first_frame(&url, connect_frame(params.clone())).await;
        assert_eq!(ending.frames.len(), 1, "{params}: {ending:?}");
        let res = &ending.frames[0];
        assert_eq!(keys(res), ["error", "id", "ok", "type"], "{res}");
        assert_eq!(res["id"], "c-1");
        assert_eq!(res["ok"], false);
        assert_eq!(keys(&res["error"]), ["code", "message"], "{res}");
        assert_eq!(res["error"]["code"], "INVALID_REQUEST");
        let message = res["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("invalid connect params: ") && message.contains(fragment),
            "{params}: {message}"
        );
        assert_eq!(ending.close, (1008, message.to_owned()), "{params}");
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_close_reason_is_cut_to_120_bytes_on_a_char_boundary() {
    let (system, url) = start(|_| {}).await;
    let mut params = connect_params(&[]);
    params["é".repeat(100)] = json!(1);
    let ending = first_frame(&url, connect_frame(params)).await;
    let message = ending.frames[0]["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.len() > 120 && message.contains(&"é".repeat(100)));
    let (code, reason) = &ending.close;
    assert_eq!(*code, 1008);
    assert!(reason.len() <= 120 && reason.len() >= 119, "{reason}");
    assert!(message.starts_with(reason.as_str()));
    system.stop.cancel();
}

fn mismatch(min: u64, max: u64) -> Value {
    json!({
        "code": "INVALID_REQUEST",
        "message": "protocol mismatch",
        "details": {
            "code": "PROTOCOL_MISMATCH",
            "clientMinProtocol": min,
            "clientMaxProtocol": max,
            "expectedProtocol": 4,
            "minimumProbeProtocol": 3,
        },
    })
}

fn with_protocols(min: u64, max: u64, mode: &str) -> Value {
    let mut params = connect_params(&["operator.read"]);
    params["minProtocol"] = json!(min);
    params["maxProtocol"] = json!(max);
    params["client"]["mode"] = json!(mode);
    params
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_3_only_client_is_refused_with_1002() {
    let (system, url) = start(|_| {}).await;
    let ending = first_frame(&url, connect_frame(with_protocols(3, 3, "cli"))).await;
    assert_rejected(&ending, mismatch(3, 3), 1002, "protocol mismatch");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_ranges_are_negotiated_to_4() {
    let (system, url) = start(|_| {}).await;
    // (min, max, mode, accepted)
    let cases = [
        (4, 4, "cli", true),
        (3, 4, "cli", true),
        (4, 9, "backend", true),
        (1, 4, "cli", true),
        (3, 3, "cli", false),
        (5, 5, "cli", false),
        (1, 2, "cli", false),
        (3, 4, "probe", true),
        (3, 3, "probe", true),
        (4, 6, "probe", true),
        (5, 6, "probe", false),
        (1, 2, "probe", false),
    ];
    for (min, max, mode, accepted) in cases {
        let (mut ws, _) = open(&url).await;
        ws.send(connect_frame(with_protocols(min, max, mode)))
            .await
            .unwrap();
        let ending = until_close_or_hello(&mut ws).await;
        if accepted {
            let res = ending.expect("accepted");
            assert_eq!(res["payload"]["protocol"], 4, "{min}..{max} {mode}: {res}");
        } else {
            let ending = ending.expect_err("refused");
            assert_rejected(&ending, mismatch(min, max), 1002, "protocol mismatch");
        }
    }
    system.stop.cancel();
}

/// `Ok(res)` for a hello-ok, `Err(ending)` for a rejection.
async fn until_close_or_hello(ws: &mut Ws) -> Result<Value, Ending> {
    let ending = tokio::time::timeout(WAIT, async {
        let first = next_json(ws).await;
        match first {
            Some(res) if res["ok"] == true => Ok(res),
            Some(res) => {
                let mut rest = until_close(ws).await;
                rest.frames.insert(0, res);
                Err(rest)
            }
            None => Err(Ending {
                frames: Vec::new(),
                close: (0, "closed".into()),
            }),
        }
    })
    .await;
    ending.expect("an answer in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_is_accepted_without_scopes() {
    let (system, url) = start(|_| {}).await;
    let (mut ws, _, res) = handshake(&url, with_protocols(3, 4, "probe")).await;
    assert_eq!(res["ok"], true, "{res}");
    assert_eq!(res["payload"]["protocol"], 4);
    assert_eq!(res["payload"]["auth"]["scopes"], json!([]));
    // Pipelined like the status command (capture 12): health works, the rest
    // is forbidden.
    for (id, method) in [("h", "health"), ("s", "status")] {
        ws.send(Message::text(
            json!({"type":"req","id":id,"method":method}).to_string(),
        ))
        .await
        .unwrap();
    }
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 2 {
        let frame = next_json(&mut ws).await.expect("still open");
        if frame["type"] == "res" {
            answers.insert(frame["id"].as_str().unwrap().to_owned(), frame);
        }
    }
    assert_eq!(answers["h"]["ok"], true, "{}", answers["h"]);
    assert_eq!(
        answers["s"],
        json!({"type":"res","id":"s","ok":false,"error":{
            "code":"FORBIDDEN","message":"missing scope: operator.read",
            "details":{"code":"MISSING_SCOPE","missingScope":"operator.read","requiredScopes":["operator.read"]},
        }})
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_role_is_refused() {
    let (system, url) = start(|_| {}).await;
    for role in ["admin", "worker", ""] {
        let mut params = connect_params(&[]);
        params["role"] = json!(role);
        let ending = first_frame(&url, connect_frame(params)).await;
        assert_rejected(
            &ending,
            json!({"code":"INVALID_REQUEST","message":"invalid role"}),
            1008,
            "invalid role",
        );
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_token_is_refused() {
    let (system, url) = start(|_| {}).await;
    let message = "unauthorized: gateway token missing (provide gateway auth token)";
    for auth in [None, Some(json!({})), Some(json!({"token":""}))] {
        let mut params = connect_params(&[]);
        match auth {
            None => {
                params.as_object_mut().unwrap().remove("auth");
            }
            Some(auth) => params["auth"] = auth,
        }
        let ending = first_frame(&url, connect_frame(params)).await;
        assert_eq!(ending.frames.len(), 1, "{ending:?}");
        let error = &ending.frames[0]["error"];
        assert_eq!(error["code"], "INVALID_REQUEST");
        assert_eq!(error["message"], message);
        assert_eq!(error["details"]["code"], "AUTH_TOKEN_MISSING");
        assert_eq!(error["details"]["canRetryWithDeviceToken"], false);
        assert_eq!(ending.close, (1008, message.to_owned()));
    }
    system.stop.cancel();
}

const MISMATCH: &str = "unauthorized: gateway token mismatch (use this gateway's gateway.auth.token or pair the device)";

fn token_mismatch() -> Value {
    json!({
        "code": "INVALID_REQUEST",
        "message": MISMATCH,
        "details": {
            "code": "AUTH_TOKEN_MISMATCH",
            "authReason": "token_mismatch",
            "canRetryWithDeviceToken": false,
            "recommendedNextStep": "update_auth_credentials",
        },
    })
}

fn wrong_token() -> Value {
    let mut params = connect_params(&["operator.read"]);
    params["auth"]["token"] = json!("wrong-token");
    params
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused() {
    let (system, url) = start(|_| {}).await;
    let ending = first_frame(&url, connect_frame(wrong_token())).await;
    assert_rejected(&ending, token_mismatch(), 1008, MISMATCH);
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_auth_failures_from_one_ip_are_rate_limited() {
    let (system, url) = start(|c| c.auth_failures_per_minute = 3).await;
    for _ in 0..3 {
        let ending = first_frame(&url, connect_frame(wrong_token())).await;
        assert_rejected(&ending, token_mismatch(), 1008, MISMATCH);
    }
    let limited = "unauthorized: too many failed authentication attempts (retry later)";
    let ending = first_frame(&url, connect_frame(wrong_token())).await;
    assert_eq!(ending.frames.len(), 1, "{ending:?}");
    let error = &ending.frames[0]["error"];
    assert_eq!(error["code"], "INVALID_REQUEST");
    assert_eq!(error["message"], limited);
    assert_eq!(error["details"]["code"], "AUTH_RATE_LIMITED");
    assert_eq!(error["details"]["recommendedNextStep"], "wait_then_retry");
    assert_eq!(ending.close, (1008, limited.to_owned()));
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_run_in_the_protocols_order() {
    let (system, url) = start(|_| {}).await;
    // Invalid params win over a protocol mismatch.
    let mut params = with_protocols(3, 3, "cli");
    params["bogus"] = json!(1);
    let ending = first_frame(&url, connect_frame(params)).await;
    let message = ending.frames[0]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("invalid connect params: "), "{message}");
    // A protocol mismatch wins over a bad role and a wrong token.
    let mut params = with_protocols(3, 3, "cli");
    params["role"] = json!("admin");
    params["auth"]["token"] = json!("wrong-token");
    let ending = first_frame(&url, connect_frame(params)).await;
    assert_rejected(&ending, mismatch(3, 3), 1002, "protocol mismatch");
    // A bad role wins over a wrong token.
    let mut params = wrong_token();
    params["role"] = json!("admin");
    let ending = first_frame(&url, connect_frame(params)).await;
    assert_rejected(
        &ending,
        json!({"code":"INVALID_REQUEST","message":"invalid role"}),
        1008,
        "invalid role",
    );
    // "first request must be connect" wins over anything in the params.
    let frame = json!({"type":"req","id":"c-1","method":"health","params":wrong_token()});
    let ending = first_frame(&url, Message::text(frame.to_string())).await;
    assert_eq!(
        ending.close.1,
        "invalid handshake: first request must be connect"
    );
    system.stop.cancel();
}

// ---------------------------------------------------------------------------
// Pre-auth limits and malformed first frames
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_handshake_is_closed_1000_after_the_timeout() {
    let timeout = Duration::from_millis(200);
    let (system, url) = start(|c| c.handshake_timeout = timeout).await;
    let started = Instant::now();
    let (mut ws, _) = open(&url).await;
    let ending = until_close(&mut ws).await;
    assert_closed_silently(&ending, 1000, "");
    // Not before the timeout (a lower bound the edge controls; how much
    // later depends on the machine, and `until_close` has the deadline).
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    // Pings do not extend the deadline: with one every 60 ms for as long
    // as the socket is open, a deadline they extended would never come.
    let (ws, _) = open(&url).await;
    let (mut sink, mut stream) = ws.split();
    let pinging = tokio::spawn(async move {
        while sink.send(Message::Ping(vec![1].into())).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    });
    let deadline = Instant::now() + WAIT;
    let close = loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!("pings kept the handshake open"),
            Ok(Some(Ok(Message::Close(frame)))) => break frame.map(|f| u16::from(f.code)),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => break None,
        }
    };
    assert_eq!(close, Some(1000));
    pinging.abort();
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_first_frame_is_closed_1009() {
    let (system, url) = start(|c| c.preauth_max_bytes = 1024).await;
    // One byte over: a valid connect padded with whitespace.
    let mut text = json!({"type":"req","id":"c-1","method":"connect","params":connect_params(&[])})
        .to_string();
    text.push_str(&" ".repeat(1025 - text.len()));
    assert_eq!(text.len(), 1025);
    let ending = first_frame(&url, Message::text(text.clone())).await;
    assert_closed_silently(&ending, 1009, "preauth payload too large");
    // As a (UTF-8) binary frame too.
    let ending = first_frame(&url, Message::binary(text.into_bytes())).await;
    assert_closed_silently(&ending, 1009, "preauth payload too large");
    // Exactly at the limit is not too large: it is judged on its content.
    let mut text = json!({"type":"event","event":"x"}).to_string();
    text.push_str(&" ".repeat(1024 - text.len()));
    let ending = first_frame(&url, Message::text(text)).await;
    assert_closed_silently(&ending, 1008, "invalid request frame");
    system.stop.cancel();
}

/// The size check comes first (§2.4 step 1), whatever the bytes are: an
/// oversized binary frame that is not UTF-8 must be closed 1009 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_non_utf8_binary_first_frame_is_closed_1009() {
    let (system, url) = start(|c| c.preauth_max_bytes = 1024).await;
    let ending = first_frame(&url, Message::binary(vec![0xff_u8; 4096])).await;
    assert_closed_silently(&ending, 1009, "preauth payload too large");
    system.stop.cancel();
}

/// §1.1: before the handshake the frame limit is the pre-auth one, so a
/// frame that declares more is refused from its header (close 1009), not
/// buffered in full (up to `max_payload`, 25 MiB) or waited for until the
/// handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_declaring_more_than_the_limit_is_refused_at_once() {
    let (system, url) = start(|c| {
        c.preauth_max_bytes = 1024;
        c.handshake_timeout = Duration::from_secs(10);
    })
    .await;
    let (mut ws, _) = open(&url).await;
    // A masked text frame header declaring 10 MB, and only 2 KiB of it.
    let mut raw = vec![0x81_u8, 0x80 | 127];
    raw.extend_from_slice(&10_000_000_u64.to_be_bytes());
    raw.extend_from_slice(&[0, 0, 0, 0]);
    raw.extend(std::iter::repeat_n(b' ', 2048));
    ws.get_mut().write_all(&raw).await.unwrap();
    let started = Instant::now();
    let ending = until_close(&mut ws).await;
    assert!(ending.frames.is_empty(), "{ending:?}");
    // 1009 from the header, not the handshake timeout's 1000 ten seconds
    // on: refused at once.
    assert_eq!(
        ending.close.0,
        1009,
        "{ending:?} after {:?}",
        started.elapsed()
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_that_is_not_json_is_closed_1000() {
    let (system, url) = start(|_| {}).await;
    for first in [
        Message::text("hello"),
        Message::text(""),
        Message::text("{\"type\":\"req\",\"id\":\"c-1\",\"method\":\"connect\""),
        Message::binary(vec![0xff_u8, 0xfe, 0x00, 0x01]),
        Message::binary(b"not json".to_vec()),
    ] {
        let ending = first_frame(&url, first).await;
        assert_closed_silently(&ending, 1000, "");
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_that_is_not_a_request_is_closed_1008() {
    let (system, url) = start(|_| {}).await;
    for first in [
        json!({"type":"event","event":"connect.challenge"}),
        json!({"type":"res","id":"c-1","ok":true}),
        json!({"id":"c-1","method":"connect"}),
        json!({"type":"req","method":"connect"}),
        json!({"type":"req","id":"","method":"connect"}),
        json!({"type":"req","id":7,"method":"connect"}),
        json!({"type":"req","id":"c-1"}),
        json!({"type":"req","id":"c-1","method":""}),
        json!({"type":"req","id":"c-1","method":["connect"]}),
        json!({"type":"req","id":"c-1","method":"connect","extra":1}),
        json!({"type":"req","id":"c-1","method":"connect","traceparent":"x".repeat(129)}),
        json!([]),
        json!(null),
        json!(42),
        json!("connect"),
    ] {
        let ending = first_frame(&url, Message::text(first.to_string())).await;
        assert_closed_silently(&ending, 1008, "invalid request frame");
    }
    system.stop.cancel();
}

async fn try_open(url: &str) -> Result<(Ws, Value), u16> {
    let opened = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("an upgrade answer in time");
    match opened {
        Ok((mut ws, _)) => {
            let challenge = next_json(&mut ws).await.expect("a challenge");
            Ok((ws, challenge))
        }
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(other) => panic!("upgrade failed: {other}"),
    }
}

/// Retries an upgrade until it succeeds (a slot frees asynchronously).
async fn open_when_free(url: &str) -> Ws {
    wait_for("a free pre-auth slot", WAIT, async || {
        match try_open(url).await {
            Ok((ws, _)) => Ok(ws),
            Err(503) => Err("HTTP 503"),
            Err(status) => panic!("no pre-auth slot (HTTP {status})"),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preauth_socket_budget_per_ip() {
    let (system, url) = start(|c| c.preauth_per_ip = 2).await;
    let (mut a, _) = try_open(&url).await.expect("first socket");
    let (mut b, _) = try_open(&url).await.expect("second socket");
    assert_eq!(try_open(&url).await.err(), Some(503));

    // The 503 over raw HTTP, with the protocol's body.
    let mut tcp = TcpStream::connect(host_of(&url)).await.unwrap();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        host_of(&url)
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let response = read_http(&mut tcp).await;
    assert!(
        response.starts_with("HTTP/1.1 503"),
        "expected a 503: {response}"
    );
    assert!(
        response.contains("Too many unauthenticated sockets"),
        "{response}"
    );

    // Authenticating frees a slot.
    a.send(connect_frame(connect_params(&[]))).await.unwrap();
    let hello = next_json(&mut a).await.expect("hello");
    assert_eq!(hello["ok"], true, "{hello}");
    let mut c = open_when_free(&url).await;
    assert_eq!(try_open(&url).await.err(), Some(503));

    // Closing an unauthenticated socket frees a slot.
    b.close(None).await.unwrap();
    let _d = open_when_free(&url).await;
    assert_eq!(try_open(&url).await.err(), Some(503));

    // A rejected handshake frees its slot too.
    c.send(connect_frame(wrong_token())).await.unwrap();
    let ending = until_close(&mut c).await;
    assert_eq!(ending.close.0, 1008);
    let _e = open_when_free(&url).await;

    // The authenticated socket is unaffected by all this.
    a.send(Message::text(
        json!({"type":"req","id":"h","method":"health"}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        let frame = next_json(&mut a).await.expect("still open");
        if frame["id"] == "h" {
            assert_eq!(frame["ok"], true, "{frame}");
            break;
        }
    }
    system.stop.cancel();
}

async fn read_http(tcp: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout_at(deadline, tcp.read(&mut chunk))
            .await
            .expect("an HTTP response in time")
            .unwrap();
        buf.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        // Enough once the headers and a short body are in, or at EOF.
        if read == 0 || text.contains("\r\n\r\n") && text.split("\r\n\r\n").nth(1) != Some("") {
            return text;
        }
    }
}

async fn http_get(url: &str, path: &str) -> String {
    let mut tcp = tokio::time::timeout(WAIT, TcpStream::connect(host_of(url)))
        .await
        .unwrap()
        .unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        host_of(url)
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut buf))
        .await
        .expect("the response in time")
        .unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_over_plain_http() {
    let (system, url) = start(|_| {}).await;
    for path in ["/healthz", "/readyz"] {
        let response = http_get(&url, path).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response}");
    }
    let response = http_get(&url, "/no-such-page").await;
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    system.stop.cancel();
}

// ---------------------------------------------------------------------------
// Replays of the recorded official clients
// ---------------------------------------------------------------------------

fn recorded_frames<'a>(records: &'a [Value], conn: u64, dir: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "frame" && r["conn"] == conn && r["dir"] == dir)
        .map(|r| &r["json"])
        .collect()
}

fn recorded_server_close(records: &[Value], conn: u64) -> (u16, String) {
    let close = records
        .iter()
        .find(|r| r["kind"] == "close" && r["conn"] == conn && r["side"] == "server")
        .expect("a server close");
    (
        close["code"].as_u64().unwrap() as u16,
        close["reason"].as_str().unwrap().to_owned(),
    )
}

/// Replays a recorded rejected `connect` and compares the error and the
/// close with what the real gateway answered.
async fn replay_rejected_connect(url: &str, file: &str, conn: u64) {
    let records = captures::records(file);
    let sent = recorded_frames(&records, conn, "c2s")[0];
    assert_eq!(sent["method"], "connect");
    let recorded = recorded_frames(&records, conn, "s2c")
        .into_iter()
        .find(|f| f["type"] == "res")
        .expect("a recorded res");
    let ending = first_frame(url, Message::text(sent.to_string())).await;
    assert_eq!(ending.frames.len(), 1, "{ending:?}");
    assert_eq!(ending.frames[0]["id"], sent["id"]);
    assert_eq!(ending.frames[0]["ok"], false);
    assert_eq!(ending.frames[0]["error"], recorded["error"], "{file}");
    assert_eq!(
        ending.close,
        recorded_server_close(&records, conn),
        "{file}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_rejections_are_answered_like_the_real_gateway() {
    let (system, url) = start(|_| {}).await;
    // The April-2026 CLI, protocol 3 with a signed device block.
    replay_rejected_connect(&url, "15-old-cli-2026.4.12-protocol3.jsonl", 1).await;
    replay_rejected_connect(&url, "15-old-cli-2026.4.12-protocol3.jsonl", 2).await;
    // A wrong token.
    replay_rejected_connect(&url, "09-errors.jsonl", 1).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_probe_gets_the_recorded_answers() {
    let (system, url) = start(|_| {}).await;
    let records = captures::records("12-status-probe-commands.jsonl");
    let sent: Vec<Value> = recorded_frames(&records, 2, "c2s")
        .into_iter()
        .map(with_test_token)
        .collect();
    let recorded = recorded_frames(&records, 2, "s2c");
    let (mut ws, _) = open(&url).await;
    for frame in &sent {
        ws.send(Message::text(frame.to_string())).await.unwrap();
    }
    let mut answers = std::collections::HashMap::new();
    while answers.len() < sent.len() {
        let frame = next_json(&mut ws).await.expect("still open");
        if frame["type"] == "res" {
            answers.insert(frame["id"].as_str().unwrap().to_owned(), frame);
        }
    }
    for expected in recorded.iter().filter(|f| f["type"] == "res") {
        let id = expected["id"].as_str().unwrap();
        let got = &answers[id];
        assert_eq!(got["ok"], expected["ok"], "{id}: {got}");
        if expected["ok"] == false {
            assert_eq!(got["error"], expected["error"], "{id}");
        }
    }
    assert_eq!(
        answers[sent[0]["id"].as_str().unwrap()]["payload"]["auth"]["scopes"],
        json!([])
    );
    system.stop.cancel();
}

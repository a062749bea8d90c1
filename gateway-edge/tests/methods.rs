//! The served methods end to end through a real edge, coordinator and store.

mod common;

use clawgate_system_tests::sandbox::Backend;
use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_two_phase_and_chat_send_lifecycle() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.write"]).await;

    // agent: accepted, then the final response on the same id.
    let id = client.fresh_id();
    client
        .send(&json!({"type":"req","id":id,"method":"agent","params":{"message":"Say hello","idempotencyKey":"a-1"}}))
        .await;
    let ack = client.response(&id).await;
    assert_eq!(ack["payload"]["status"], "accepted", "{ack}");
    assert!(ack["payload"]["acceptedAt"].as_i64().unwrap() > 0);
    let last = client.response(&id).await;
    assert_eq!(last["ok"], true, "{last}");
    assert_eq!(last["payload"]["status"], "ok");
    assert_eq!(last["payload"]["summary"], "completed");
    assert_eq!(
        last["payload"]["result"]["payloads"][0]["text"],
        "Say hello"
    );
    // Events arrive with a per-connection seq from 1, and chat delta/final.
    // The final response comes from Wait, the events from the event stream:
    // the response may overtake the last events, so wait for them.
    client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
        .await;
    let seqs: Vec<u64> = client
        .received
        .iter()
        .filter_map(|f| f["seq"].as_u64())
        .collect();
    assert_eq!(seqs.first(), Some(&1));
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(
        client
            .received
            .iter()
            .any(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
    );
    assert!(
        client
            .received
            .iter()
            .any(|f| f["event"] == "agent" && f["payload"]["stream"] == "assistant")
    );

    // chat.send: started, in_flight while running, the cached result after.
    let started = client
        .request(
            "chat.send",
            json!({"sessionKey":"main","message":"SLOW please","idempotencyKey":"c-1"}),
        )
        .await;
    assert_eq!(
        started["payload"],
        json!({"runId":"c-1","status":"started"})
    );
    let again = client
        .request(
            "chat.send",
            json!({"sessionKey":"main","message":"SLOW please","idempotencyKey":"c-1"}),
        )
        .await;
    assert_eq!(again["payload"]["status"], "in_flight");
    let timeout = client
        .request("agent.wait", json!({"runId":"c-1","timeoutMs":50}))
        .await;
    assert_eq!(
        timeout["payload"],
        json!({"runId":"c-1","status":"timeout"})
    );
    let waited = client
        .request("agent.wait", json!({"runId":"c-1","timeoutMs":60000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let cached = client
        .request(
            "chat.send",
            json!({"sessionKey":"main","message":"SLOW please","idempotencyKey":"c-1"}),
        )
        .await;
    assert_eq!(cached["payload"], json!({"runId":"c-1","status":"ok"}));
    let history = client
        .request("chat.history", json!({"sessionKey":"main"}))
        .await;
    let messages = history["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(history["payload"]["sessionKey"], "main");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_abort_by_session_and_by_run() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    client
        .request(
            "chat.send",
            json!({"sessionKey":"abort-me","message":"SLOW run","idempotencyKey":"ab-1"}),
        )
        .await;
    client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "delta")
        .await;
    let aborted = client
        .request("chat.abort", json!({"sessionKey":"abort-me"}))
        .await;
    assert_eq!(
        aborted["payload"],
        json!({"ok":true,"aborted":true,"runIds":["ab-1"]})
    );
    let event = client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "aborted")
        .await;
    assert_eq!(event["payload"]["stopReason"], "rpc");
    let waited = client
        .request("agent.wait", json!({"runId":"ab-1","timeoutMs":10000}))
        .await;
    assert_eq!(waited["payload"]["status"], "error");
    assert_eq!(waited["payload"]["error"], "aborted");
    assert_eq!(waited["payload"]["stopReason"], "rpc");
    let again = client
        .request("chat.abort", json!({"sessionKey":"abort-me"}))
        .await;
    assert_eq!(
        again["payload"],
        json!({"ok":true,"aborted":false,"runIds":[]})
    );

    // By run: a wrong session is refused, the right one aborts.
    client
        .request(
            "chat.send",
            json!({"sessionKey":"abort-me","message":"SLOW again","idempotencyKey":"ab-2"}),
        )
        .await;
    let wrong = client
        .request("chat.abort", json!({"sessionKey":"other","runId":"ab-2"}))
        .await;
    assert_eq!(wrong["error"]["message"], "runId does not match sessionKey");
    let by_run = client
        .request(
            "chat.abort",
            json!({"sessionKey":"abort-me","runId":"ab-2"}),
        )
        .await;
    assert_eq!(
        by_run["payload"],
        json!({"ok":true,"aborted":true,"runIds":["ab-2"]})
    );
    // The partial text is kept in the history, marked aborted.
    let history = client
        .request("chat.history", json!({"sessionKey":"abort-me"}))
        .await;
    let messages = history["payload"]["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "assistant" && m["aborted"] == true),
        "{history}"
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_methods() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    let subscribed = client.request("sessions.subscribe", json!({})).await;
    assert_eq!(subscribed["payload"], json!({"subscribed": true}));
    client
        .request(
            "chat.send",
            json!({"sessionKey":"s1","message":"hi","idempotencyKey":"s-1"}),
        )
        .await;
    client.request("agent.wait", json!({"runId":"s-1"})).await;
    let list = client.request("sessions.list", json!({})).await;
    assert_eq!(list["payload"]["sessions"][0]["key"], "agent:main:s1");
    assert_eq!(
        list["payload"]["defaults"]["model"],
        serde_json::Value::Null
    );
    let reset = client.request("sessions.reset", json!({"key":"s1"})).await;
    assert_eq!(reset["payload"]["ok"], true);
    assert_eq!(reset["payload"]["key"], "agent:main:s1");
    client
        .event(|f| f["event"] == "sessions.changed" && f["payload"]["reason"] == "reset")
        .await;
    let main = client
        .request("sessions.delete", json!({"key":"main"}))
        .await;
    assert_eq!(
        main["error"]["message"],
        "Cannot delete the main session (main)."
    );
    let deleted = client.request("sessions.delete", json!({"key":"s1"})).await;
    assert_eq!(deleted["payload"]["deleted"], true);
    let empty = client
        .request("chat.history", json!({"sessionKey":"never-used"}))
        .await;
    assert_eq!(empty["payload"]["messages"], json!([]));
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_retry_while_running_is_the_same_run() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.write"]).await;
    let params = json!({"message":"SLOW retry me","idempotencyKey":"retry-1","sessionKey":"retry"});
    let first = client.fresh_id();
    client
        .send(&json!({"type":"req","id":first,"method":"agent","params":params}))
        .await;
    let ack = client.response(&first).await;
    assert_eq!(ack["payload"]["status"], "accepted");
    // The retry (a new request id, the same key) is the same run: one
    // in_flight answer (the final goes to the first request), and the run
    // executed once.
    let retry = client.fresh_id();
    client
        .send(&json!({"type":"req","id":retry,"method":"agent","params":params}))
        .await;
    let retry_ack = client.response(&retry).await;
    assert_eq!(retry_ack["payload"]["runId"], "retry-1");
    assert_eq!(retry_ack["payload"]["status"], "in_flight");
    let first_final = client.response(&first).await;
    assert_eq!(first_final["payload"]["status"], "ok");
    let history = client
        .request("chat.history", json!({"sessionKey":"retry"}))
        .await;
    assert_eq!(
        history["payload"]["messages"].as_array().unwrap().len(),
        2,
        "one user and one assistant turn"
    );
    // A retry after the end answers the cached final at once.
    let late = client.request("agent", params.clone()).await;
    assert_eq!(late["payload"]["status"], "ok");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_tick_events_arrive_on_their_intervals() {
    let system = system().await;
    let mut config = system.edge_config();
    config.health_interval = std::time::Duration::from_millis(50);
    config.tick_interval = std::time::Duration::from_millis(50);
    let (url, _) = system.edge(config).await;
    let mut client = Client::connect(&url, &["operator.read"]).await;
    let health = client.event(|f| f["event"] == "health").await;
    assert_eq!(health["payload"]["ok"], true);
    assert!(health["seq"].as_u64().is_some());
    let tick = client.event(|f| f["event"] == "tick").await;
    assert!(tick["payload"]["ts"].as_i64().is_some());
    system.stop.cancel();
}

/// The session feed forgets the sessions nobody watches any more: a client
/// that subscribed to many sessions and went away does not leave them
/// followed for the edge's lifetime. (They go once the followed sessions
/// have doubled since the last pruning, past 1,024.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_feed_forgets_sessions_nobody_watches() {
    let system = system().await;
    // The feed is the event machinery's: this edge is served with it at hand.
    let mut config = system.edge_config();
    // One connection watches past the pruning threshold.
    config.max_watched_sessions = 2000;
    let edge = gateway_edge::Edge::new(
        config.clone(),
        gateway_edge::Backends::connect_lazy(&config).unwrap(),
    );
    let events = std::sync::Arc::new(gateway_edge::events::Events::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(gateway_edge::transport::server::serve_with_events(
        edge.clone(),
        events.clone(),
        listener,
        system.stop.clone().cancelled_owned(),
    ));
    let subscribe = |key: String| json!({ "key": key });
    let mut first = Client::connect(&url, &["operator.read"]).await;
    for i in 0..1100 {
        let answer = first
            .request(
                "sessions.messages.subscribe",
                subscribe(format!("gone-{i}")),
            )
            .await;
        assert_eq!(answer["ok"], true, "{answer}");
    }
    assert_eq!(events.feed.followed(), 1100);
    drop(first);
    common::wait_until(
        "the first client to leave",
        std::time::Duration::from_secs(30),
        || edge.connection_count() == 0,
    )
    .await;
    let mut second = Client::connect(&url, &["operator.read", "operator.write"]).await;
    for i in 0..1000 {
        let answer = second
            .request(
                "sessions.messages.subscribe",
                subscribe(format!("kept-{i}")),
            )
            .await;
        assert_eq!(answer["ok"], true, "{answer}");
    }
    let followed = events.feed.followed();
    assert!(
        followed <= 1000,
        "{followed} followed: the gone client's sessions were kept"
    );
    // What the second client watches is still served.
    let answer = second
        .request(
            "chat.send",
            json!({ "sessionKey": "kept-999", "message": "hi", "idempotencyKey": "feed-run" }),
        )
        .await;
    assert_eq!(answer["ok"], true, "{answer}");
    second
        .event(|e| {
            e["event"] == "session.message" && e["payload"]["sessionKey"] == "agent:main:kept-999"
        })
        .await;
}

/// The features this gateway does not have answer their reads empty, in
/// the exact shape of OpenClaw's result schema; their writes stay unserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_features_answer_empty() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    let answers = [
        (
            "cron.runs",
            json!({"scope": "all", "limit": 20, "offset": 40, "statuses": ["error"]}),
            json!({"entries": [], "total": 0, "offset": 0, "limit": 20, "hasMore": false, "nextOffset": null}),
        ),
        (
            "cron.runs",
            json!({"scope": "job", "id": "nightly"}),
            json!({"entries": [], "total": 0, "offset": 0, "limit": 50, "hasMore": false, "nextOffset": null}),
        ),
        (
            "cron.list",
            json!({"limit": 200, "offset": 0}),
            json!({"jobs": [], "total": 0, "offset": 0, "limit": 200, "hasMore": false, "nextOffset": null}),
        ),
        (
            "channels.pairing.list",
            json!({}),
            json!({
                "accounts": [], "requests": [], "commandOwnerConfigured": false,
                "limits": {"pendingPerAccount": 0, "ttlMs": 0},
            }),
        ),
        (
            "device.pair.list",
            json!({}),
            json!({"pending": [], "paired": []}),
        ),
        ("worktrees.list", json!({}), json!({"worktrees": []})),
        (
            "plugins.list",
            json!({}),
            json!({"plugins": [], "diagnostics": [], "mutationAllowed": false}),
        ),
        (
            "skills.search",
            json!({"query": "git", "limit": 20}),
            json!({"results": []}),
        ),
        (
            "transcripts.list",
            json!({"limit": 50}),
            json!({"sessions": [], "nextCursor": null}),
        ),
        (
            "approval.history",
            json!({"limit": 50}),
            json!({"items": []}),
        ),
        ("last-heartbeat", json!({}), json!(null)),
        (
            "plugins.catalog.browse",
            json!({"searchSource": "openclaw-control-ui", "pageSize": 24}),
            json!({"items": []}),
        ),
        (
            "config.schema.lookup",
            json!({"path": "plugins.entries.memory-core.config"}),
            json!({
                "path": "plugins.entries.memory-core.config",
                "schema": {"type": "object", "additionalProperties": false},
                "children": [],
            }),
        ),
        (
            "exec.approval.grants.list",
            json!({"limit": 100}),
            json!({"grants": []}),
        ),
        (
            "artifacts.list",
            json!({"sessionKey": "main", "messageRole": "assistant"}),
            json!({"artifacts": []}),
        ),
        (
            "migrations.memory.plan",
            json!({"agentId": "main", "overwrite": false}),
            json!({"agentId": "main", "workspace": "clawgate", "providers": []}),
        ),
        (
            "exec.approvals.get",
            json!({}),
            json!({
                "path": "clawgate", "exists": false, "hash": "none", "file": {"version": 1},
                "resolvedDefaults": {
                    "security": "deny", "ask": "off", "askFallback": "deny", "autoAllowSkills": false,
                },
            }),
        ),
        (
            "themes.list",
            json!({}),
            json!({
                "current": {"id": "claw", "mode": "system", "scope": "gateway", "overrides": {}},
                "theme": {
                    "id": "claw", "name": "Claw", "description": "The Control UI's default theme.",
                    "source": "builtin", "modes": ["light", "dark"],
                },
                "themes": [{
                    "id": "claw", "name": "Claw", "description": "The Control UI's default theme.",
                    "source": "builtin", "modes": ["light", "dark"],
                }],
            }),
        ),
    ];
    for (method, params, payload) in answers {
        let answer = client.request(method, params).await;
        assert_eq!(answer["ok"], true, "{method}: {answer}");
        assert!(answer.get("payload").is_some(), "{method}: {answer}");
        assert_eq!(answer["payload"], payload, "{method}");
    }
    // The two with a timestamp: the rest is exact.
    let before = clawgate_common::clock::now_ms();
    for (method, params, rest) in [
        (
            "channels.status",
            json!({"probe": false, "timeoutMs": 8000}),
            json!({
                "channelOrder": [], "channelLabels": {}, "channels": {},
                "channelAccounts": {}, "channelDefaultAccountId": {},
            }),
        ),
        ("node.list", json!({}), json!({"nodes": []})),
    ] {
        let mut payload = client.request(method, params).await["payload"].take();
        let ts = payload["ts"].take().as_i64().expect("ts");
        assert!(ts >= before, "{method}: ts {ts}");
        payload.as_object_mut().unwrap().remove("ts");
        assert_eq!(payload, rest, "{method}");
    }
    // GitHub: none configured, none detected.
    let effective = json!({
        "source": "system-detected", "credentialKind": "native", "credentialState": "unavailable",
        "account": null, "gitAuthor": {"name": null, "email": null}, "evidence": "none",
        "accessExpiresAtMs": null, "refreshState": "not_applicable", "oauthScopes": [],
        "repositoryGrants": "unknown",
    });
    for (scope, identity) in [("system", effective.clone()), ("agent", json!(null))] {
        let params = json!({"agentId": "main", "selectedScope": scope});
        let answer = client.request("tools.github.status", params).await;
        assert_eq!(
            answer["payload"],
            json!({
                "agentId": "main", "selectedScope": scope,
                "selected": {"scope": scope, "configured": false, "identity": identity},
                "effective": effective,
            })
        );
    }
    let no_scope = client
        .request("tools.github.status", json!({"agentId": "main"}))
        .await;
    assert_eq!(
        no_scope["error"]["message"],
        "invalid tools.github.status params: must have required property 'selectedScope'"
    );
    // Web search: disabled, for the model asked about.
    let params = json!({"agentId": "main", "modelProvider": "acme", "modelId": "m1"});
    let answer = client.request("webSearch.status", params).await;
    let runtime = answer["payload"]["model"]["runtime"].clone();
    assert!(runtime.as_str().is_some_and(|r| !r.is_empty()), "{answer}");
    assert_eq!(
        answer["payload"],
        json!({
            "enabled": false, "provider": null, "agentId": "main",
            "model": {"provider": "acme", "id": "m1", "runtime": runtime},
            "route": {
                "kind": "unavailable", "label": "Web search",
                "reason": "This gateway runs no web search tool.", "testable": false,
            },
            "providers": [],
        })
    );
    // The presence list: the gateway, then this connection.
    let presence = client.request("system-presence", json!({})).await;
    let entries = presence["payload"].as_array().expect("a list");
    assert_eq!(entries.len(), 2, "{presence}");
    assert_eq!(entries[0]["mode"], "gateway");
    assert_eq!(entries[0]["reason"], "self");
    assert_eq!(entries[1]["mode"], "cli", "{presence}");
    // The workshop's manifest is stamped with the time it was read.
    let mut manifest = client
        .request("skills.proposals.list", json!({"agentId": "main"}))
        .await["payload"]
        .take();
    let stamp = manifest["updatedAt"].take();
    assert!(
        stamp
            .as_str()
            .is_some_and(|s| s.len() == 24 && s.ends_with('Z')),
        "{stamp}"
    );
    assert_eq!(
        manifest,
        json!({
            "schema": "openclaw.skill-workshop.proposals-manifest.v1", "updatedAt": null,
            "proposals": [], "installedSkills": [],
        })
    );
    // Their params are OpenClaw's, closed.
    let extra = client
        .request("worktrees.list", json!({"repoRoot": "/"}))
        .await;
    assert_eq!(
        extra["error"]["message"],
        "invalid worktrees.list params: must NOT have additional properties (repoRoot)"
    );
    // Writes to them are not served.
    for method in [
        "worktrees.create",
        "channels.logout",
        "device.pair.approve",
        "cron.add",
    ] {
        let answer = client.request(method, json!({})).await;
        assert_eq!(
            answer["error"],
            json!({"code": "INVALID_REQUEST", "message": format!("unknown method: {method}")}),
        );
    }
    system.stop.cancel();
}

/// `logs.tail` reads the ring this process's log output feeds: the lines
/// after the cursor asked, within the read's limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_tail_reads_the_recent_lines_after_a_cursor() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.read"]).await;
    let ring = clawgate_telemetry::recent_logs();
    ring.push("logs-tail test: first");
    let first = client.request("logs.tail", json!({})).await["payload"].take();
    let file = first["file"].as_str().expect("file").to_owned();
    assert!(file.starts_with("gateway-edge/"), "{first}");
    let lines = first["lines"].as_array().expect("lines");
    assert!(lines.contains(&json!("logs-tail test: first")), "{first}");
    let cursor = first["cursor"].as_u64().expect("cursor");
    assert_eq!(first["size"], cursor);
    // Other tests of this process log too: only ours are checked for.
    ring.push("logs-tail test: second");
    ring.push("logs-tail test: third");
    let next = client
        .request(
            "logs.tail",
            json!({"cursor": cursor, "limit": 5000, "maxBytes": 1_000_000}),
        )
        .await["payload"]
        .take();
    assert_eq!(next["file"], file.as_str());
    let lines: Vec<&str> = next["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .filter(|l| l.starts_with("logs-tail test"))
        .collect();
    assert_eq!(lines, ["logs-tail test: second", "logs-tail test: third"]);
    // Each line counts with its newline.
    assert!(next["cursor"].as_u64().unwrap() >= cursor + 23 + 22);
    // A cursor past the end: read from the start, marked reset.
    let past = client
        .request("logs.tail", json!({"cursor": u64::MAX / 2, "limit": 1}))
        .await["payload"]
        .take();
    assert_eq!(past["reset"], true, "{past}");
    assert_eq!(past["lines"].as_array().unwrap().len(), 1);
    let bad = client.request("logs.tail", json!({"limit": 0})).await;
    assert_eq!(
        bad["error"]["message"],
        "invalid logs.tail params: /limit must be an integer in 1..5000"
    );
    system.stop.cancel();
}

/// A sandbox with the stub runtime, its store on `backend`.
async fn system_on(backend: Backend) -> clawgate_system_tests::sandbox::Sandbox {
    clawgate_system_tests::sandbox::Sandbox::builder()
        .backend(backend)
        .runtime(common::StubRuntime::new())
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_preview_shows_the_last_texts_embedded() {
    sessions_preview_shows_the_last_texts(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_preview_shows_the_last_texts_postgres() {
    sessions_preview_shows_the_last_texts(Backend::Postgres).await;
}

/// `sessions.preview`: the last user and assistant texts of each session
/// asked, from the store on `backend` (and `sessions.get`).
async fn sessions_preview_shows_the_last_texts(backend: Backend) {
    let system = system_on(backend).await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    for (n, message) in ["first question", "second question"].iter().enumerate() {
        let key = format!("p-{n}");
        client
            .request(
                "chat.send",
                json!({"sessionKey": "preview", "message": message, "idempotencyKey": key}),
            )
            .await;
        client.request("agent.wait", json!({"runId": key})).await;
    }
    let answer = client
        .request(
            "sessions.preview",
            json!({"keys": ["preview", "agent:main:nobody"], "limit": 3, "maxChars": 20}),
        )
        .await;
    let payload = &answer["payload"];
    assert!(payload["ts"].as_i64().is_some(), "{answer}");
    // The echo runtime answers with the message: the last three texts.
    assert_eq!(
        payload["previews"],
        json!([
            {"key": "preview", "status": "ok", "items": [
                {"role": "assistant", "text": "first question"},
                {"role": "user", "text": "second question"},
                {"role": "assistant", "text": "second question"},
            ]},
            {"key": "agent:main:nobody", "status": "missing", "items": []},
        ])
    );
    // sessions.get: the recent messages themselves, as chat.history has them.
    let got = client
        .request("sessions.get", json!({"sessionKey": "preview", "limit": 2}))
        .await;
    let history = client
        .request("chat.history", json!({"sessionKey": "preview", "limit": 2}))
        .await;
    assert_eq!(
        got["payload"]["messages"], history["payload"]["messages"],
        "{got}"
    );
    assert_eq!(
        got["payload"]["messages"][1]["content"][0]["text"],
        "second question"
    );
    // chat.message.get: one message by the id history gave it, cut to
    // maxChars; also once a reset replaced its transcript.
    let second = &history["payload"]["messages"][1];
    let id = second["__openclaw"]["id"].as_str().expect("a message id");
    let one = client
        .request(
            "chat.message.get",
            json!({"sessionKey": "preview", "messageId": id}),
        )
        .await;
    assert_eq!(one["payload"], json!({"ok": true, "message": second}));
    let short = client
        .request(
            "chat.message.get",
            json!({"sessionKey": "preview", "messageId": id, "maxChars": 6}),
        )
        .await;
    let mut cut_message = second.clone();
    cut_message["content"][0]["text"] = json!("second");
    assert_eq!(
        short["payload"],
        json!({"ok": true, "message": cut_message})
    );
    let reset = client
        .request("sessions.reset", json!({"key": "preview"}))
        .await;
    assert_eq!(reset["ok"], true, "{reset}");
    let archived = client
        .request(
            "chat.message.get",
            json!({"sessionKey": "preview", "messageId": id}),
        )
        .await;
    assert_eq!(archived["payload"], json!({"ok": true, "message": second}));
    for (key, message_id) in [
        ("preview", format!("{}:999", id.rsplit_once(':').unwrap().0)),
        ("preview", "not-an-id".to_owned()),
        ("nobody", id.to_owned()),
    ] {
        let missing = client
            .request(
                "chat.message.get",
                json!({"sessionKey": key, "messageId": message_id}),
            )
            .await;
        assert_eq!(
            missing["payload"],
            json!({"ok": false, "unavailableReason": "not_found"}),
            "{key} {message_id}"
        );
    }
    let nobody = client
        .request("sessions.get", json!({"key": "nobody"}))
        .await;
    assert_eq!(nobody["payload"], json!({"messages": []}));
    let keyless = client.request("sessions.get", json!({})).await;
    assert_eq!(
        keyless["error"],
        json!({"code": "INVALID_REQUEST", "message": "key required"})
    );
    let cut = client
        .request(
            "sessions.preview",
            json!({"keys": ["preview"], "limit": 1, "maxChars": 10}),
        )
        .await;
    assert_eq!(
        cut["error"]["message"],
        "invalid sessions.preview params: /maxChars must be an integer in 20..18446744073709551615"
    );
    let none = client
        .request("sessions.preview", json!({"keys": []}))
        .await;
    assert_eq!(
        none["error"]["message"],
        "invalid sessions.preview params: /keys must NOT have fewer than 1 items"
    );
    system.stop.cancel();
}

/// `diagnostics.lanes`: the coordinator's global cap as the `main` lane and
/// its session lanes as the dynamic ones, read while a run executes and
/// another waits behind it in the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnostics_lanes_show_the_cap_and_the_session_lanes() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    let lane = |active: u32, queued: u32| {
        json!([{
            "lane": "main", "queuedCount": queued, "activeCount": active, "maxConcurrent": 16,
            "draining": false, "generation": 0, "blockedBy": null,
        }])
    };
    let idle = client.request("diagnostics.lanes", json!({})).await["payload"].take();
    assert!(idle["ts"].as_i64().is_some_and(|ts| ts > 0), "{idle}");
    assert_eq!(idle["lanes"], lane(0, 0), "{idle}");
    assert_eq!(idle["dynamic"], json!(null), "{idle}");

    client
        .request(
            "chat.send",
            json!({"sessionKey":"lanes","message":"SLOW first","idempotencyKey":"lanes-1"}),
        )
        .await;
    client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "delta")
        .await;
    client
        .request(
            "chat.send",
            json!({"sessionKey":"lanes","message":"second","idempotencyKey":"lanes-2","queueMode":"followup"}),
        )
        .await;
    let busy = client.request("diagnostics.lanes", json!({})).await["payload"].take();
    assert_eq!(busy["lanes"], lane(1, 1), "{busy}");
    assert_eq!(
        busy["dynamic"],
        json!({"laneCount": 1, "activeCount": 1, "queuedCount": 1, "queuedLaneCount": 1}),
        "{busy}"
    );
    client
        .request("chat.abort", json!({"sessionKey":"lanes"}))
        .await;
    system.stop.cancel();
}

/// The Usage page's reads on `backend`: the stub runtime (the echo's)
/// reports a word count as each run's usage (it lists no models, so usage
/// is the runtime's own), which the transcript keeps; `sessions.usage`
/// sums it per session and over sessions, `.timeseries` and `.logs` show
/// one session's, `usage.status` lists no provider windows.
async fn usage_from_transcripts(backend: Backend) {
    let system = system_on(backend).await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    for (key, message, run) in [
        ("usage-a", "one two three", "u-1"),
        ("usage-a", "four five", "u-2"),
        ("usage-b", "six", "u-3"),
    ] {
        client
            .request(
                "chat.send",
                json!({"sessionKey": key, "message": message, "idempotencyKey": run}),
            )
            .await;
        let waited = client
            .request("agent.wait", json!({"runId": run, "timeoutMs": 10000}))
            .await;
        assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    }
    let status = client.request("usage.status", json!({})).await["payload"].take();
    assert!(status["updatedAt"].as_i64().is_some(), "{status}");
    assert_eq!(status["providers"], json!([]));

    let report = client
        .request("sessions.usage", json!({"mode": "utc", "limit": 1}))
        .await["payload"]
        .take();
    let today = report["endDate"].as_str().expect("endDate").to_owned();
    let zero_costs = json!({
        "cacheRead": 0, "cacheWrite": 0, "totalCost": 0, "inputCost": 0, "outputCost": 0,
        "cacheReadCost": 0, "cacheWriteCost": 0,
    });
    let totals = |input: u64, output: u64, priced: u64| {
        let mut t = zero_costs.clone();
        t["input"] = json!(input);
        t["output"] = json!(output);
        t["totalTokens"] = json!(input + output);
        t["missingCostEntries"] = json!(priced);
        t
    };
    assert_eq!(report["totals"], totals(6, 6, 3), "{report}");
    assert_eq!(report["creatorOptions"], json!([{"key": "[\"unknown\"]"}]));
    // One row asked: the most recently updated session.
    let rows = report["sessions"].as_array().expect("sessions");
    assert_eq!(rows.len(), 1, "{report}");
    let row = &rows[0];
    assert_eq!(row["key"], "agent:main:usage-b");
    assert_eq!(
        (&row["scope"], &row["agentId"], &row["creatorKey"]),
        (&json!("instance"), &json!("main"), &json!("[\"unknown\"]"))
    );
    assert_eq!(
        (&row["modelProvider"], &row["model"]),
        (&json!("stub"), &json!("stub"))
    );
    let usage = &row["usage"];
    let first = usage["firstActivity"].as_i64().expect("firstActivity");
    let last = usage["lastActivity"].as_i64().expect("lastActivity");
    let mut expected = totals(1, 1, 1);
    let day_totals = {
        let mut day = totals(1, 1, 1);
        day["date"] = json!(today);
        day["tokens"] = json!(2);
        day["cost"] = json!(0);
        day
    };
    let counts = json!({"total": 2, "user": 1, "assistant": 1, "toolCalls": 0, "toolResults": 0, "errors": 0});
    let mut day_counts = counts.clone();
    day_counts["date"] = json!(today);
    for (field, value) in [
        ("sessionId", row["sessionId"].clone()),
        ("firstActivity", json!(first)),
        ("lastActivity", json!(last)),
        ("durationMs", json!(last - first)),
        ("activityDates", json!([today])),
        ("dailyBreakdown", json!([day_totals])),
        ("dailyMessageCounts", json!([day_counts])),
        (
            "dailyModelUsage",
            json!([{"date": today, "provider": "stub", "model": "stub", "tokens": 2, "cost": 0, "count": 1}]),
        ),
        ("messageCounts", counts),
        (
            "toolUsage",
            json!({"totalCalls": 0, "uniqueTools": 0, "tools": []}),
        ),
        (
            "modelUsage",
            json!([{"provider": "stub", "model": "stub", "count": 1, "totals": totals(1, 1, 1)}]),
        ),
    ] {
        expected[field] = value;
    }
    assert_eq!(*usage, expected, "{report}");
    let aggregates = &report["aggregates"];
    assert_eq!(aggregates["sessionCount"], 2, "{aggregates}");
    assert_eq!(
        aggregates["messages"],
        json!({"total": 6, "user": 3, "assistant": 3, "toolCalls": 0, "toolResults": 0, "errors": 0})
    );
    assert_eq!(
        aggregates["byModel"],
        json!([{"provider": "stub", "model": "stub", "count": 3, "totals": totals(6, 6, 3)}])
    );
    assert_eq!(
        aggregates["daily"],
        json!([{"date": today, "tokens": 12, "cost": 0, "messages": 6, "toolCalls": 0, "errors": 0}])
    );
    assert_eq!(
        aggregates["byAgent"],
        json!([{"agentId": "main", "totals": totals(6, 6, 3)}])
    );

    // One session by key; a range before today holds nothing.
    let one = client
        .request("sessions.usage", json!({"key": "usage-a"}))
        .await["payload"]
        .take();
    assert_eq!(one["totals"], totals(5, 5, 2), "{one}");
    let before = client
        .request(
            "sessions.usage",
            json!({"startDate": "2020-01-01", "endDate": "2020-01-31"}),
        )
        .await["payload"]
        .take();
    assert_eq!(
        (&before["sessions"], &before["totals"], &before["startDate"]),
        (&json!([]), &totals(0, 0, 0), &json!("2020-01-01"))
    );
    let wrong = client
        .request(
            "sessions.usage",
            json!({"agentScope": "all", "key": "usage-a"}),
        )
        .await;
    assert_eq!(
        wrong["error"]["message"],
        "agentScope=all cannot be combined with key or agentId"
    );

    let series = client
        .request("sessions.usage.timeseries", json!({"key": "usage-a"}))
        .await["payload"]
        .take();
    let points = series["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "{series}");
    assert_eq!(
        (
            &points[0]["totalTokens"],
            &points[1]["totalTokens"],
            &points[1]["cumulativeTokens"]
        ),
        (&json!(6), &json!(4), &json!(10))
    );
    let logs = client
        .request("sessions.usage.logs", json!({"key": "usage-a"}))
        .await["payload"]
        .take();
    let lines: Vec<(String, String, Value)> = logs["logs"]
        .as_array()
        .expect("logs")
        .iter()
        .map(|l| {
            (
                l["role"].as_str().unwrap().to_owned(),
                l["content"].as_str().unwrap().to_owned(),
                l["tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(lines.len(), 4, "{logs}");
    assert_eq!(
        lines[0],
        ("user".into(), "one two three".into(), Value::Null)
    );
    assert_eq!(lines[1].0, "assistant");
    assert_eq!(lines[1].2, json!(6));
    let missing = client
        .request("sessions.usage.timeseries", json!({"key": "nobody"}))
        .await;
    assert_eq!(
        missing["error"]["message"],
        "No transcript found for session: nobody"
    );
    let no_lines = client
        .request("sessions.usage.logs", json!({"key": "nobody"}))
        .await;
    assert_eq!(no_lines["payload"], json!({"logs": []}));
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_from_transcripts_embedded() {
    usage_from_transcripts(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_from_transcripts_postgres() {
    usage_from_transcripts(Backend::Postgres).await;
}

/// `sessions.patchMany`: one patch, checked once, applied to each target
/// with its own expectations; `sessions.compact`: OpenClaw's no-op answer,
/// with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_many_and_compact() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.admin"]).await;
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": "many-a", "message": "hello", "idempotencyKey": "many-1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    client
        .request("agent.wait", json!({"runId": "many-1", "timeoutMs": 10000}))
        .await;
    let patched = client
        .request(
            "sessions.patchMany",
            json!({
                "targets": [
                    {"key": "many-a"},
                    {"key": "many-b", "expectedSessionId": "not-its-id"},
                    {"key": "many-c"},
                ],
                "patch": {"label": "batch", "pinned": true},
            }),
        )
        .await;
    let outcomes = &patched["payload"]["outcomes"];
    assert_eq!(outcomes[0], json!({"ok": true, "key": "agent:main:many-a"}));
    assert_eq!(outcomes[1]["ok"], false, "{patched}");
    assert_eq!(outcomes[1]["key"], "agent:main:many-b");
    assert_eq!(outcomes[1]["error"]["code"], "INVALID_REQUEST");
    assert_eq!(outcomes[2], json!({"ok": true, "key": "agent:main:many-c"}));
    let listed = client.request("sessions.list", json!({})).await;
    let labels: Vec<(String, Value)> = listed["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["key"].as_str().unwrap().to_owned(),
                row["label"].clone(),
            )
        })
        .collect();
    assert!(
        labels.contains(&("agent:main:many-a".into(), json!("batch"))),
        "{labels:?}"
    );
    assert!(
        labels.contains(&("agent:main:many-c".into(), json!("batch"))),
        "{labels:?}"
    );
    assert!(
        !labels.iter().any(|(key, _)| key == "agent:main:many-b"),
        "{labels:?}"
    );
    for (params, message) in [
        (
            json!({"targets": [], "patch": {"label": "x"}}),
            "invalid sessions.patchMany params: /targets must have 1 to 100 items",
        ),
        (
            json!({"targets": [{"key": "many-a"}], "patch": {}}),
            "invalid sessions.patchMany params: /patch must be an object with 1 property at least",
        ),
        (
            json!({"targets": [{"key": "many-a", "label": "x"}], "patch": {"label": "x"}}),
            "invalid sessions.patchMany params: /targets/0 must NOT have additional properties (label)",
        ),
    ] {
        let refused = client.request("sessions.patchMany", params).await;
        assert_eq!(refused["error"]["message"], message, "{refused}");
    }

    for (key, reason) in [
        (
            "many-a",
            "compaction is not supported: this gateway keeps transcripts whole",
        ),
        ("many-c", "no transcript"),
        ("many-none", "no sessionId"),
    ] {
        let compacted = client
            .request("sessions.compact", json!({"key": key, "maxLines": 10}))
            .await;
        assert_eq!(
            compacted["payload"],
            json!({"ok": true, "key": format!("agent:main:{key}"), "compacted": false, "reason": reason}),
        );
    }
    system.stop.cancel();
}

//! A chat through the edge moves the metrics of all three services, as
//! scraped over HTTP from their `/metrics` endpoints.

mod common;

use std::net::SocketAddr;

use clawgate_telemetry::metrics::{OPENMETRICS_CONTENT_TYPE, http_request, sample_value};
use common::*;
use serde_json::json;

/// One scrape of `address`, with a lookup of `name{labels}` in it.
struct Scrape(String);

impl Scrape {
    async fn of(address: SocketAddr) -> Self {
        let reply = http_request(address, "GET", "/metrics").await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            reply.content_type.as_deref(),
            Some(OPENMETRICS_CONTENT_TYPE)
        );
        Self(reply.body)
    }

    fn value(&self, name: &str, labels: &str) -> f64 {
        sample_value(&self.0, name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels} in\n{}", self.0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_moves_every_service_metrics() {
    let system = system().await;
    let mut config = system.edge_config();
    config.metrics_on_public_port = true;
    let (url, _) = system.edge(config).await;
    let edge_address: SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
    let mut client = Client::connect(&url, &["operator.write"]).await;

    let params = json!({"sessionKey":"main","message":"hello metrics","idempotencyKey":"m-1"});
    let started = client.request("chat.send", params.clone()).await;
    assert_eq!(started["payload"]["status"], "started", "{started}");
    client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
        .await;
    // The same intent again is answered from the finished run.
    let cached = client.request("chat.send", params).await;
    assert_eq!(cached["payload"]["status"], "ok", "{cached}");
    let refused = client.request("chat.send", json!({})).await;
    assert_eq!(refused["ok"], false, "{refused}");

    // Edge: requests by outcome, the ACK, events, the open connection (it
    // received run events, so it is registered).
    let edge = Scrape::of(edge_address).await;
    let requests = |outcome: &str| {
        let labels = format!("{{method=\"chat.send\",outcome=\"{outcome}\"}}");
        edge.value("clawgate_edge_requests_total", &labels)
    };
    assert_eq!(requests("ok"), 2.0);
    assert_eq!(requests("INVALID_REQUEST"), 1.0);
    let chat_ack = "{method=\"chat.send\"}";
    assert_eq!(
        edge.value("clawgate_edge_ack_duration_seconds_count", chat_ack),
        1.0
    );
    assert!(edge.value("clawgate_edge_events_sent_total", "") > 0.0);
    let over_budget = "{reason=\"over_budget\"}";
    assert_eq!(
        edge.value("clawgate_edge_events_dropped_total", over_budget),
        0.0
    );
    assert_eq!(edge.value("clawgate_edge_connections_open", ""), 1.0);
    assert!(edge.value("clawgate_edge_connections_accepted_total", "") >= 1.0);

    // Coordinator: one new run (ACKed), one replay, one run ended ok; the
    // final chat event is emitted only after the terminal is counted.
    let coordinator = Scrape::of(system.coordinator_metrics_address()).await;
    let admissions = |outcome: &str, reason: &str| {
        let labels = format!("{{outcome=\"{outcome}\",reason=\"{reason}\"}}");
        coordinator.value("clawgate_coordinator_admissions_total", &labels)
    };
    assert_eq!(admissions("accepted", "new"), 1.0);
    assert_eq!(admissions("deduplicated", "completed"), 1.0);
    let ok = "{status=\"ok\"}";
    assert_eq!(
        coordinator.value("clawgate_coordinator_runs_finished_total", ok),
        1.0
    );
    let ack_count = "clawgate_coordinator_ack_duration_seconds_count";
    assert_eq!(coordinator.value(ack_count, ""), 1.0);
    // Nothing waits; the finished run frees its slot just after its event.
    assert_eq!(
        coordinator.value("clawgate_coordinator_runs_queued", ""),
        0.0
    );
    assert!(coordinator.value("clawgate_coordinator_runs_executing", "") <= 1.0);

    // Store: the run's record and its transcript writes were timed.
    let store = Scrape::of(system.store_metrics_address()).await;
    let operations = |operation: &str| {
        let labels = format!("{{operation=\"{operation}\",outcome=\"ok\"}}");
        store.value("clawgate_store_operation_duration_seconds_count", &labels)
    };
    assert!(operations("create_run") >= 1.0);
    // A run's transcript is written by its start and finish commits.
    assert!(operations("start_run") >= 1.0);
    assert!(operations("finish_run") >= 1.0);

    // Every service reports what happened to its spans (nothing exported
    // here: no collector is configured, so nothing is dropped either).
    for scrape in [&edge, &coordinator, &store] {
        assert_eq!(scrape.value("clawgate_trace_spans_dropped_total", ""), 0.0);
        assert_eq!(scrape.value("clawgate_trace_spans_failed_total", ""), 0.0);
    }
    system.stop.cancel();
}

/// By default `/metrics` is not on the public port (anyone who reaches it
/// would read the edge's counters) but on a listen address of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_apart_from_the_public_port_unless_asked() {
    let system = system().await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let private = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_address, private_address) =
        (public.local_addr().unwrap(), private.local_addr().unwrap());
    tokio::spawn(gateway_edge::serve_with_metrics(
        system.edge_config(),
        public,
        Some(private),
        system.stop.clone().cancelled_owned(),
    ));
    let what = "the edge's /healthz to answer";
    wait_for(what, DEADLINE, async || {
        http_request(public_address, "GET", "/healthz")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let public_metrics = http_request(public_address, "GET", "/metrics")
        .await
        .unwrap();
    assert_eq!(public_metrics.status, 404, "{}", public_metrics.body);
    let scrape = Scrape::of(private_address).await;
    assert!(scrape.value("clawgate_edge_sockets_open", "") >= 0.0);
    system.stop.cancel();
}

/// The first send to a session the store has never seen writes once before
/// its ACK, and reads nothing: the session row comes with the run record
/// (CreateRun's `create_session`), not from a read and a PatchSession of
/// its own first. The session is there as soon as the send is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_to_a_new_session_is_one_store_write() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.read", "operator.write"]).await;
    let served = |scrape: &Scrape, operation: &str| {
        let labels = format!("{{operation=\"{operation}\",outcome=\"ok\"}}");
        sample_value(
            &scrape.0,
            "clawgate_store_operation_duration_seconds_count",
            &labels,
        )
        .unwrap_or(0.0)
    };
    let before = Scrape::of(system.store_metrics_address()).await;

    let params = json!({"sessionKey":"brand-new","message":"hi","idempotencyKey":"n-1"});
    let started = client.request("chat.send", params).await;
    assert_eq!(started["payload"]["status"], "started", "{started}");
    let after = Scrape::of(system.store_metrics_address()).await;
    for (operation, expected) in [
        ("patch_session", 0.0),
        ("get_session", 0.0),
        ("create_run", 1.0),
    ] {
        assert_eq!(
            served(&after, operation) - served(&before, operation),
            expected,
            "{operation}: no session read or write of its own"
        );
    }
    let described = client
        .request("sessions.describe", json!({ "key": "brand-new" }))
        .await;
    assert_eq!(described["ok"], true, "{described}");

    // The next send to it is made from the settings the edge now knows the
    // session has: no read, one write again.
    client
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
        .await;
    let before = Scrape::of(system.store_metrics_address()).await;
    let params = json!({"sessionKey":"brand-new","message":"again","idempotencyKey":"n-2"});
    let started = client.request("chat.send", params).await;
    assert_eq!(started["payload"]["status"], "started", "{started}");
    let after = Scrape::of(system.store_metrics_address()).await;
    for (operation, expected) in [("get_session", 0.0), ("create_run", 1.0)] {
        assert_eq!(
            served(&after, operation) - served(&before, operation),
            expected,
            "{operation}"
        );
    }
    system.stop.cancel();
}

//! Several edges in front of one coordinator, resuming a run's events on
//! another edge, and the slow-consumer policy.

mod common;

use std::time::Duration;

use common::*;
use run_coordinator::config::CoordinatorConfig;
use serde_json::{Value, json};

fn run_seqs(frames: &[Value], run_id: &str) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| f["event"] == "agent" && f["payload"]["runId"] == run_id)
        .map(|f| f["payload"]["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_on_edge_a_is_seen_waited_and_aborted_on_edge_b() {
    let system = system().await;
    let (url_a, _) = system.edge(system.edge_config()).await;
    let (url_b, _) = system.edge(system.edge_config()).await;
    let mut on_a = Client::connect(&url_a, &["operator.write"]).await;
    let mut on_b = Client::connect(&url_b, &["operator.admin"]).await;
    let started = on_a
        .request(
            "chat.send",
            json!({"sessionKey":"shared","message":"SLOW across edges","idempotencyKey":"x-1"}),
        )
        .await;
    assert_eq!(started["payload"]["status"], "started");
    // B streams the run's chat events although A started it.
    let delta = on_b
        .event(|f| f["event"] == "chat" && f["payload"]["runId"] == "x-1")
        .await;
    assert_eq!(delta["payload"]["sessionKey"], "agent:main:shared");
    let waiting = on_b
        .request("agent.wait", json!({"runId":"x-1","timeoutMs":10}))
        .await;
    assert_eq!(waiting["payload"]["status"], "timeout");
    let aborted = on_b
        .request("chat.abort", json!({"sessionKey":"shared"}))
        .await;
    assert_eq!(
        aborted["payload"],
        json!({"ok":true,"aborted":true,"runIds":["x-1"]})
    );
    let waited = on_b
        .request("agent.wait", json!({"runId":"x-1","timeoutMs":10000}))
        .await;
    assert_eq!(waited["payload"]["error"], "aborted");
    // A hears the abort too.
    let end = on_a
        .event(|f| f["event"] == "chat" && f["payload"]["state"] == "aborted")
        .await;
    assert_eq!(end["payload"]["runId"], "x-1");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_on_another_edge_has_no_gap_and_no_duplicate() {
    let system = system().await;
    let (url_a, _) = system.edge(system.edge_config()).await;
    let (url_b, _) = system.edge(system.edge_config()).await;
    let mut first = Client::connect(&url_a, &["operator.write"]).await;
    first
        .request(
            "chat.send",
            json!({"sessionKey":"resumed","message":"SLOW resume me","idempotencyKey":"r-1"}),
        )
        .await;
    // Read a few agent events of the run, then drop mid-run.
    first
        .event(|f| {
            f["event"] == "agent"
                && f["payload"]["runId"] == "r-1"
                && f["payload"]["stream"] == "assistant"
                && f["payload"]["seq"].as_u64() >= Some(4)
        })
        .await;
    let seen = run_seqs(&first.received, "r-1");
    let last_seen = *seen.last().unwrap();
    drop(first);

    let mut second = Client::connect(&url_b, &["operator.read"]).await;
    let resumed = second
        .request("runs.resume", json!({"runId":"r-1","fromSeq":last_seen}))
        .await;
    assert_eq!(resumed["ok"], true, "{resumed}");
    let end = second
        .event(|f| {
            f["event"] == "agent"
                && f["payload"]["runId"] == "r-1"
                && f["payload"]["data"]["phase"] == "end"
        })
        .await;
    assert_eq!(end["payload"]["data"]["status"], "ok");
    // Before the resume is answered, the broadcast may bring edge B's own
    // copies of events the client saw on edge A (B's feed can lag A's; a
    // client keeps what it has by seq). The resume itself sends only what
    // follows `fromSeq`, and between the two every later seq comes once.
    let answered = second
        .received
        .iter()
        .position(|f| f["type"] == "res" && f["payload"]["resumedAfterSeq"] == last_seen)
        .expect("the resume's answer is among the frames");
    let replayed = run_seqs(&second.received[answered..], "r-1");
    assert!(
        replayed.iter().all(|seq| *seq > last_seen),
        "the resume sent what the client had: {replayed:?} after {last_seen}"
    );
    let rest: Vec<u64> = run_seqs(&second.received, "r-1")
        .into_iter()
        .filter(|seq| *seq > last_seen)
        .collect();
    assert_eq!(
        rest.first(),
        Some(&(last_seen + 1)),
        "starts right after the last seen seq: {rest:?}"
    );
    assert!(
        rest.windows(2).all(|w| w[1] == w[0] + 1),
        "gap or duplicate: {rest:?}"
    );
    // The run's final chat event arrives, exactly once.
    second
        .event(|f| {
            f["event"] == "chat"
                && f["payload"]["runId"] == "r-1"
                && f["payload"]["state"] == "final"
        })
        .await;
    let finals = second
        .received
        .iter()
        .filter(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
        .count();
    assert_eq!(finals, 1);
    // A position that no longer exists is refused clearly.
    let unknown = second
        .request("runs.resume", json!({"runId":"nope","fromSeq":0}))
        .await;
    assert_eq!(unknown["error"]["details"]["code"], "RESUME_UNAVAILABLE");
    system.stop.cancel();
}

/// The (event name, run seq) of every `agent`/`chat` event of `run_id` in
/// `frames`, in arrival order.
fn run_events(frames: &[Value], run_id: &str) -> Vec<(String, u64)> {
    frames
        .iter()
        .filter(|f| f["type"] == "event" && f["payload"]["runId"] == run_id)
        .filter_map(|f| {
            Some((
                f["event"].as_str()?.to_owned(),
                f["payload"]["seq"].as_u64()?,
            ))
        })
        .collect()
}

/// The bad interleaving, forced step by step: a client reconnects, one of
/// the run's broadcast events reaches the new connection, and only then is
/// its `runs.resume` (from what the old connection saw) handled. Everything
/// after `fromSeq` must arrive exactly once: the events missed while away
/// (replayed), the one already received (not repeated) and the rest (live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_a_broadcast_event_reached_the_new_connection_has_no_gap() {
    let runtime = GatedRuntime::new(8);
    let config = CoordinatorConfig {
        delta_interval: Duration::ZERO,
        ..CoordinatorConfig::default()
    };
    let system = system_with_runtime(config, runtime.clone()).await;
    let (url, _) = system.edge(system.edge_config()).await;
    let assistant = |pieces: usize| {
        move |f: &Value| {
            f["event"] == "agent"
                && f["payload"]["runId"] == "g-1"
                && f["payload"]["stream"] == "assistant"
                && f["payload"]["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("piece{} ", pieces - 1)))
        }
    };
    // Sees every event of the run, for reference.
    let mut observer = Client::connect(&url, &[READ]).await;
    let mut away = Client::connect(&url, &[WRITE]).await;
    let sent = away
        .request(
            "chat.send",
            json!({"sessionKey":"gated","message":"go","idempotencyKey":"g-1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    runtime.release(2);
    away.event(assistant(2)).await;
    let from_seq = *run_seqs(&away.received, "g-1").last().unwrap();
    drop(away);

    // Two pieces while nobody of this client is connected.
    runtime.release(2);
    observer.event(assistant(4)).await;
    let mut back = Client::connect(&url, &[READ]).await;
    // One piece reaches the new connection through the broadcast first.
    runtime.release(1);
    back.event(assistant(5)).await;
    let resumed = back
        .request("runs.resume", json!({"runId":"g-1","fromSeq":from_seq}))
        .await;
    assert_eq!(resumed["ok"], true, "{resumed}");
    // A resume from the newest event, while the run is quiet, is answered
    // at once (not when the run's next event comes).
    let newest = *run_seqs(&observer.received, "g-1").last().unwrap();
    let mut late = Client::connect(&url, &[READ]).await;
    let resumed = late
        .request("runs.resume", json!({"runId":"g-1","fromSeq":newest}))
        .await;
    assert_eq!(resumed["ok"], true, "{resumed}");
    runtime.release(3);
    let is_final = |f: &Value| {
        f["event"] == "chat" && f["payload"]["runId"] == "g-1" && f["payload"]["state"] == "final"
    };
    back.event(is_final).await;
    observer.event(is_final).await;
    late.event(is_final).await;
    // Each got every event of the run after its position exactly once.
    let after = |from: u64| -> Vec<(String, u64)> {
        let mut events = run_events(&observer.received, "g-1");
        events.retain(|(_, seq)| *seq > from);
        events.sort();
        events
    };
    let sorted = |client: &Client| {
        let mut events = run_events(&client.received, "g-1");
        events.sort();
        events
    };
    assert_eq!(
        sorted(&late),
        after(newest),
        "the late resume, after {newest}"
    );
    assert_eq!(
        sorted(&back),
        after(from_seq),
        "gap or duplicate after {from_seq}"
    );
    let final_text =
        back.received.iter().rev().find(|f| is_final(f)).unwrap()["payload"]["message"]["content"]
            [0]["text"]
            .clone();
    assert_eq!(
        final_text,
        (0..8).map(|n| format!("piece{n} ")).collect::<String>()
    );
    system.stop.cancel();
}

/// Submits a run straight to the coordinator and waits for its end.
async fn run_to_end(system: &Sandbox, run_id: &str, message: &str) {
    submit_and_wait(system.coordinator_url(), run_id, message).await;
}

async fn submit_and_wait(coordinator_url: &str, run_id: &str, message: &str) {
    use clawgate_proto::run_coordinator::v1 as pb;
    let mut coordinator =
        pb::run_coordinator_client::RunCoordinatorClient::connect(coordinator_url.to_owned())
            .await
            .unwrap();
    coordinator
        .submit(pb::SubmitRequest {
            run_id: run_id.into(),
            session_key: "flood".into(),
            kind: "chat".into(),
            message: message.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let waited = coordinator
        .wait(pb::WaitRequest {
            run_id: run_id.into(),
            timeout_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(waited.terminal);
}

/// The text a run has streamed so far, per the coordinator.
async fn streamed(system: &Sandbox, run_id: &str) -> usize {
    use clawgate_proto::run_coordinator::v1 as pb;
    let mut coordinator = pb::run_coordinator_client::RunCoordinatorClient::connect(
        system.coordinator_url().to_owned(),
    )
    .await
    .unwrap();
    let got = coordinator
        .get(pb::GetRequest {
            run_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    got.snapshot.map_or(0, |s| s.text.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumers_drop_deltas_then_close_without_hurting_others() {
    // Every runtime chunk becomes its own delta event, so a flood is many events.
    let system = system_with(run_coordinator::config::CoordinatorConfig {
        delta_interval: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    let mut config = system.edge_config();
    config.max_buffered_bytes = 64 * 1024;
    config.socket_send_buffer = 16 * 1024;
    let (url, edge) = system.edge(config).await;
    // `healthy` reads all the time, in its own task, until the last run ends.
    let mut healthy = Client::connect(&url, &["operator.read"]).await;
    let healthy = tokio::spawn(async move {
        healthy
            .event(|f| {
                f["event"] == "chat"
                    && f["payload"]["runId"] == "last"
                    && f["payload"]["state"] == "final"
            })
            .await;
        healthy.received
    });
    let mut pausing = Client::open_small_buffer(&url).await;
    pausing.handshake(&["operator.read"]).await;
    let mut stuck = Client::open_small_buffer(&url).await;
    stuck.handshake(&["operator.read"]).await;

    // `pausing` reads nothing while the first deltas flow (its outbox fills
    // and deltas are dropped), then reads everything before the end.
    let message = format!("FLOOD {}", "x".repeat(30 * 1024));
    let flood = {
        let (coordinator_url, message) = (system.coordinator_url().to_owned(), message.clone());
        tokio::spawn(async move { submit_and_wait(&coordinator_url, "f-1", &message).await })
    };
    // Every 2 ms, so that no peak of an outbox goes unseen.
    let mut sampling = Pacer::steady("the flood to stream", DEADLINE, Duration::from_millis(2));
    let mut max_queued = 0;
    while streamed(&system, "f-1").await < 15 * 1024 {
        for conn in edge.connections() {
            max_queued = max_queued.max(conn.outbox.queued_bytes());
        }
        if let Err(timed_out) = sampling.pause(None).await {
            panic!("{timed_out}");
        }
    }
    assert!(
        max_queued <= 64 * 1024,
        "an outbox exceeded its budget: {max_queued}"
    );
    let end = pausing
        .event(|f| {
            f["event"] == "chat"
                && f["payload"]["runId"] == "f-1"
                && f["payload"]["state"] != "delta"
        })
        .await;
    assert_eq!(end["payload"]["state"], "final");
    let seqs: Vec<u64> = pausing
        .received
        .iter()
        .filter_map(|f| f["seq"].as_u64())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "seq never goes back: {seqs:?}"
    );
    assert!(
        seqs.windows(2).any(|w| w[1] > w[0] + 1),
        "dropped deltas show as a gap: {seqs:?}"
    );
    flood.await.unwrap();
    drop(pausing);

    // `stuck` never reads: more floods until a non-droppable event does not
    // fit its outbox any more, which closes it 1008.
    wait_until("pausing to leave", DEADLINE, || {
        edge.connection_count() <= 2
    })
    .await;
    for n in 2..=8 {
        if edge.connection_count() < 2 {
            break;
        }
        run_to_end(&system, &format!("f-{n}"), &message).await;
    }
    assert_eq!(edge.connection_count(), 1, "the stuck client was closed");
    let (code, reason) = stuck.until_closed().await;
    assert_eq!((code, reason.as_str()), (1008, "slow consumer"));

    // The healthy client was never closed and got every event that may not
    // be dropped (each run's start, end and final), in order. (Under CPU
    // starvation in a test process even it may have a delta dropped.)
    run_to_end(&system, "last", "done").await;
    let received = healthy.await.unwrap();
    let seqs: Vec<u64> = received.iter().filter_map(|f| f["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "healthy seqs: {seqs:?}"
    );
    let finals: Vec<&str> = received
        .iter()
        .filter(|f| f["event"] == "chat" && f["payload"]["state"] == "final")
        .map(|f| f["payload"]["runId"].as_str().unwrap())
        .collect();
    assert_eq!(finals.first(), Some(&"f-1"));
    assert_eq!(finals.last(), Some(&"last"));
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_says_so_then_closes_1012() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let mut client = Client::connect(&url, &["operator.read"]).await;
    system.stop.cancel();
    let shutdown = client.event(|f| f["event"] == "shutdown").await;
    assert!(shutdown["seq"].as_u64().is_some());
    let (code, reason) = client.until_closed().await;
    assert_eq!((code, reason.as_str()), (1012, "service restart"));
}

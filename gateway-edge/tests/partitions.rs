//! Coordinators sharing the partitions behind the edge: real lease-mode
//! coordinators, each owning some partitions, and edges that route each
//! call to its session's owner and follow every owner's event stream.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clawgate_system_tests::fault_proxy::FaultProxy;
use clawgate_system_tests::sandbox::{CoordinatorOptions, Member, Ownership};
use common::split::{edge_following, split, until_streams};
use common::*;
use gateway_edge::Edge;
use run_coordinator::ownership::Placement;
use serde_json::{Value, json};
use session_store::SessionStore;

async fn send(client: &mut Client, session: &str, message: &str, run_id: &str) -> Value {
    let res = client
        .request(
            "chat.send",
            json!({ "sessionKey": session, "message": message, "idempotencyKey": run_id }),
        )
        .await;
    assert_eq!(res["ok"], true, "{res}");
    res["payload"].clone()
}

/// `send`, which must start a run.
async fn start(client: &mut Client, session: &str, message: &str, run_id: &str) {
    let sent = send(client, session, message, run_id).await;
    assert_eq!(sent["status"], "started", "{run_id}: {sent}");
}

/// A slow run `long` in `session` (its first event seen), and `queued` in
/// the session's lane behind it.
async fn busy(client: &mut Client, session: &str, long: &str, queued: &str) {
    start(client, session, "SLOW first", long).await;
    client
        .event(|f| f["event"] == "chat" && f["payload"]["runId"] == long)
        .await;
    let sent = client
        .request(
            "chat.send",
            json!({ "sessionKey": session, "message": "next", "idempotencyKey": queued, "queueMode": "followup" }),
        )
        .await;
    assert_eq!(sent["payload"]["status"], "started", "{sent}");
}

/// A failover's cast besides A and B: a standby C (every partition is held,
/// so it takes none yet), an edge seeded with A and B following both, a
/// session in each half, a client.
struct Scene {
    c: Member,
    edge: Arc<Edge>,
    on_a: String,
    on_b: String,
    client: Client,
}

async fn scene(split: &Sandbox, a: &Member, b: &Member) -> Scene {
    let c = split
        .start_coordinator(StubRuntime::new(), split.coordinator_options().await)
        .await;
    let seeds = format!("{},{}", a.url, b.url);
    let (url, edge) = edge_following(split, &seeds, 2).await;
    let client = Client::connect(&url, &[ADMIN]).await;
    Scene {
        c,
        edge,
        on_a: split.session_in(0, 0),
        on_b: split.session_in(1, 0),
        client,
    }
}

/// A new send to `session` is answered and run to its end by `member`.
async fn runs_on(
    split: &Sandbox,
    client: &mut Client,
    session: &str,
    run_id: &str,
    member: &Member,
) {
    start(client, session, "after", run_id).await;
    let end = client.chat_end(run_id).await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    assert_eq!(owner_of(split, run_id).await, member.id());
}

/// The coordinator member that owns the run's record.
async fn owner_of(split: &Sandbox, run_id: &str) -> String {
    split
        .store
        .get_run(run_id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no record of {run_id}"))
        .owner
}

/// The `seq`s of the run's agent events a client received, in order.
fn agent_seqs(frames: &[Value], run_id: &str) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| f["event"] == "agent" && f["payload"]["runId"] == run_id)
        .map(|f| f["payload"]["seq"].as_u64().unwrap())
        .collect()
}

/// The edge follows one event stream per coordinator of `members`.
fn assert_streams_from(edge: &Edge, members: &[&Member]) {
    let mut streams = edge
        .backends
        .coordinator
        .routes()
        .stream_addresses(tokio::time::Instant::now());
    streams.sort();
    let mut expected: Vec<String> = members.iter().map(|m| m.url.clone()).collect();
    expected.sort();
    assert_eq!(streams, expected, "one event stream per coordinator");
}

fn address_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_edge_serves_the_sessions_of_two_coordinators() {
    let split = split(4).await;
    let (a, b) = split
        .halves(StubRuntime::new(), split.coordinator_options().await)
        .await;
    let seeds = format!("{},{}", a.url, b.url);
    let (url, edge) = edge_following(&split, &seeds, 2).await;
    assert_streams_from(&edge, &[&a, &b]);
    let (on_a, on_b) = (split.session_in(0, 0), split.session_in(1, 0));
    let mut client = Client::connect(&url, &[ADMIN]).await;

    // A send to each half is answered, runs on its session's owner, and its
    // final event comes from that owner's stream.
    for (session, run) in [(&on_a, "a-quick"), (&on_b, "b-quick")] {
        start(&mut client, session, "hello", run).await;
    }
    for run in ["a-quick", "b-quick"] {
        let end = client.chat_end(run).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
        assert!(
            end["payload"]["message"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("hello")
        );
    }
    assert_eq!(owner_of(&split, "a-quick").await, a.id());
    assert_eq!(owner_of(&split, "b-quick").await, b.id());

    // Another edge, which never saw these runs, finds each on its owner
    // (by the run's record) for agent.wait.
    let (url2, _) = edge_following(&split, &seeds, 2).await;
    let mut other = Client::connect(&url2, &[ADMIN]).await;
    for run in ["a-quick", "b-quick"] {
        let waited = other
            .request("agent.wait", json!({ "runId": run, "timeoutMs": 10_000 }))
            .await;
        assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    }

    // Runs going in both halves: listed together, resumed on the other
    // edge with no gap and no duplicate though the two streams' events
    // interleave there, then aborted from it.
    let mut watcher = Client::connect(&url2, &[READ]).await;
    for (session, run) in [(&on_a, "a-slow"), (&on_b, "b-slow")] {
        start(&mut client, session, "SLOW one", run).await;
    }
    for run in ["a-slow", "b-slow"] {
        watcher
            .event(|f| {
                f["event"] == "agent"
                    && f["payload"]["runId"] == run
                    && f["payload"]["stream"] == "assistant"
                    && f["payload"]["seq"].as_u64() >= Some(3)
            })
            .await;
    }
    let listed = other.request("sessions.list", json!({})).await;
    let active: Vec<String> = listed["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row["activeRunIds"].as_array().cloned().unwrap_or_default())
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    for run in ["a-slow", "b-slow"] {
        assert!(
            active.contains(&run.to_owned()),
            "{run} not listed: {listed}"
        );
    }
    for run in ["a-slow", "b-slow"] {
        let resumed = watcher
            .request("runs.resume", json!({ "runId": run, "fromSeq": 0 }))
            .await;
        assert_eq!(resumed["ok"], true, "{resumed}");
    }
    let aborted = other
        .request(
            "chat.abort",
            json!({ "sessionKey": on_a, "runId": "a-slow" }),
        )
        .await;
    assert_eq!(
        aborted["payload"],
        json!({ "ok": true, "aborted": true, "runIds": ["a-slow"] })
    );
    let aborted = other
        .request("chat.abort", json!({ "sessionKey": on_b }))
        .await;
    assert_eq!(
        aborted["payload"],
        json!({ "ok": true, "aborted": true, "runIds": ["b-slow"] })
    );
    for run in ["a-slow", "b-slow"] {
        let end = client.chat_end(run).await;
        assert_eq!(end["payload"]["state"], "aborted", "{end}");
        let end = watcher.chat_end(run).await;
        assert_eq!(end["payload"]["state"], "aborted", "{end}");
        // From its start to its end, each event once, whether the broadcast
        // or the resume stream brought it.
        let first = watcher
            .received
            .iter()
            .find(|f| f["event"] == "agent" && f["payload"]["runId"] == run)
            .unwrap();
        assert_eq!(first["payload"]["data"]["phase"], "start", "{first}");
        let seqs = agent_seqs(&watcher.received, run);
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{run}: gap or duplicate: {seqs:?}"
        );
    }
    split.stop.cancel();
    a.stop.cancel();
    b.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_handing_over_moves_its_sessions_to_a_standby() {
    let split = split(4).await;
    let mut second = split.coordinator_options().await;
    // Its executing runs get this long to finish at shutdown.
    second.drain_timeout = Duration::from_millis(300);
    let (a, b) = split.halves(StubRuntime::new(), second).await;
    let Scene {
        c,
        edge,
        on_a,
        on_b,
        mut client,
    } = scene(&split, &a, &b).await;

    start(&mut client, &on_a, "SLOW on a", "a-during").await;
    busy(&mut client, &on_b, "b-long", "b-next").await;

    // B shuts down: it drains (b-long is aborted after its drain timeout),
    // releases its leases, and C takes its partitions.
    b.stop.cancel();
    let end = client.chat_end("b-long").await;
    assert_ne!(end["payload"]["state"], "final", "{end}");
    c.until_serving().await;
    assert_eq!(c.partitions(), [1, 3]);
    // The queued run moved with its session and ran once, on C.
    let end = client.chat_end("b-next").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    assert_eq!(owner_of(&split, "b-next").await, c.id());
    until_streams(&edge, 2).await;
    assert_streams_from(&edge, &[&a, &c]);

    // The same idempotency key is the same run, wherever it is now.
    let again = send(&mut client, &on_b, "next", "b-next").await;
    assert_eq!(again["status"], "ok", "{again}");
    let waited = client
        .request(
            "agent.wait",
            json!({ "runId": "b-long", "timeoutMs": 10_000 }),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "error", "{waited}");
    // B's session is C's now; the edge was never told C's address.
    runs_on(&split, &mut client, &on_b, "b-after", &c).await;
    // A's run went on undisturbed.
    let end = client.chat_end("a-during").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    assert_eq!(owner_of(&split, "a-during").await, a.id());
    b.served.await.unwrap().unwrap();
    split.stop.cancel();
    a.stop.cancel();
    c.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_a_coordinator_cut_off_from_everyone_end_lost_for_clients() {
    let split = split(4).await;
    // B reaches the store, and is reached, only through proxies the test
    // can cut: to everyone else it is as good as killed.
    let to_store = FaultProxy::start(address_of(split.store_url())).await;
    let mut second = split.coordinator_options().await;
    let front = FaultProxy::start(second.listener.local_addr().unwrap()).await;
    second.store_url = to_store.url();
    second.advertise = Some(front.url());
    let (a, b) = split.halves(StubRuntime::new(), second).await;
    let Scene {
        c,
        on_a,
        on_b,
        mut client,
        ..
    } = scene(&split, &a, &b).await;

    busy(&mut client, &on_b, "b-lost", "b-requeued").await;
    start(&mut client, &on_a, "SLOW on a", "a-fine").await;

    to_store.partition(Duration::from_secs(600));
    front.partition(Duration::from_secs(600));

    // C takes B's partitions once B's leases lapse: the run B was executing
    // is settled `lost`, which this edge never saw happen, and reaches the
    // client as the run's end all the same.
    let end = client.chat_end("b-lost").await;
    assert_eq!(end["payload"]["state"], "error", "{end}");
    assert_eq!(
        end["payload"]["errorDetail"]["providerRuntimeFailureKind"], "lost",
        "{end}"
    );
    // The run that had not started runs on C, once.
    let end = client.chat_end("b-requeued").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    assert_eq!(owner_of(&split, "b-requeued").await, c.id());
    let end = client.chat_end("a-fine").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    // New sends to B's session are served by C.
    runs_on(&split, &mut client, &on_b, "b-after", &c).await;
    split.stop.cancel();
    a.stop.cancel();
    b.stop.cancel();
    c.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balanced_coordinators_behind_one_edge_follow_a_join() {
    let split = split(16).await;
    let balanced = |mut options: CoordinatorOptions| {
        options.ownership = Ownership::Lease(Placement::Balanced);
        options
    };
    let a = split
        .start_coordinator(
            StubRuntime::new(),
            balanced(split.coordinator_options().await),
        )
        .await;
    let b = split
        .start_coordinator(
            StubRuntime::new(),
            balanced(split.coordinator_options().await),
        )
        .await;
    split.until_spread(&[&a, &b]).await;
    // Seeded with one of them only: the other is found in the leases.
    let (url, edge) = edge_following(&split, &a.url, 2).await;
    assert_streams_from(&edge, &[&a, &b]);
    let mut client = Client::connect(&url, &[ADMIN]).await;
    for (n, member) in [&a, &b].into_iter().enumerate() {
        let session = split.session_in(member.partitions()[0], 0);
        runs_on(
            &split,
            &mut client,
            &session,
            &format!("before-{n}"),
            member,
        )
        .await;
    }

    // A run going and one queued behind it in every partition.
    for p in 0..split.partitions {
        let session = split.session_in(p, 2);
        busy(
            &mut client,
            &session,
            &format!("long-{p}"),
            &format!("queued-{p}"),
        )
        .await;
    }

    let before = [a.partitions(), b.partitions()];

    // A third joins: partitions move to it by handoff, and the edge follows.
    let c = split
        .start_coordinator(
            StubRuntime::new(),
            balanced(split.coordinator_options().await),
        )
        .await;
    split.until_spread(&[&a, &b, &c]).await;
    until_streams(&edge, 3).await;
    assert_streams_from(&edge, &[&a, &b, &c]);
    let after = [a.partitions(), b.partitions(), c.partitions()];
    // Every run ends for the client, the moved ones too (those executing
    // finish or are aborted by the handoff); each queued one ran, on its
    // partition's owner before the move or after it.
    for p in 0..split.partitions {
        let end = client.chat_end(&format!("long-{p}")).await;
        assert!(
            matches!(end["payload"]["state"].as_str(), Some("final" | "aborted")),
            "{end}"
        );
        let queued = format!("queued-{p}");
        let end = client.chat_end(&queued).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
        let ran = owner_of(&split, &queued).await;
        let held = |m: &&Member, share: &Vec<u32>| share.contains(&p) && m.id() == ran;
        assert!(
            [&a, &b].iter().zip(&before).any(|(m, s)| held(m, s))
                || [&a, &b, &c].iter().zip(&after).any(|(m, s)| held(m, s)),
            "{queued} ran on {ran}, which held partition {p} neither before nor after the join"
        );
    }
    for (n, member) in [&a, &b, &c].into_iter().enumerate() {
        let session = split.session_in(member.partitions()[0], 1);
        runs_on(&split, &mut client, &session, &format!("after-{n}"), member).await;
    }
    split.stop.cancel();
    for member in [a, b, c] {
        member.stop.cancel();
    }
}

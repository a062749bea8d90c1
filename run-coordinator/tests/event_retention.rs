//! The bounds on run event logs, each crossed and observed:
//! `--event-retention` (a finished run's log is replayable that long after
//! its end, then a replay gets a reset), `--max-retained-runs` (finished logs
//! beyond it are dropped oldest finished first; an unfinished run's log
//! never), `--max-events-per-run` (a log keeps its newest events: an older
//! position, a replay from 0 included, gets a reset, as does a subscriber
//! that fell behind) and `--max-stream-events` (the same for the all-runs
//! stream). In paused tokio time with the coordinator in process, and once
//! through the real binary, configured by the `COORDINATOR_*` variables.

mod common;

use std::sync::Arc;
use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_system_tests::process::{Process, service_command};
use common::*;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::events::{HubLimits, LIVE_ONLY};
use run_coordinator_api::events::{EventBody, RunEvent};
use run_coordinator_api::model::RunStatus;
use tonic::transport::Channel;

fn limits(change: impl FnOnce(&mut HubLimits)) -> CoordinatorConfig {
    let mut config = CoordinatorConfig {
        // One assistant event per echo piece.
        delta_interval: Duration::from_millis(1),
        ..CoordinatorConfig::default()
    };
    change(&mut config.events);
    config
}

/// Replays a finished run's log after `from`: its events' seqs, or the
/// reset's reason.
async fn replay(local: &Local, run_id: &str, from: u64) -> Result<Vec<u64>, String> {
    let mut subscription = local
        .coordinator
        .subscribe_run(run_id, from, None)
        .map_err(|reset| reset.reason)?;
    let mut seqs = Vec::new();
    while let Some(event) = subscription.next().await {
        seqs.push(event.map_err(|reset| reset.reason)?.seq);
    }
    Ok(seqs)
}

/// The first `n` events of an unfinished run's log after `from`.
async fn replay_some(local: &Local, run_id: &str, from: u64, n: usize) -> Vec<Arc<RunEvent>> {
    let mut subscription = local
        .coordinator
        .subscribe_run(run_id, from, None)
        .unwrap_or_else(|reset| panic!("{run_id}: {}", reset.reason));
    let mut events = Vec::new();
    while events.len() < n {
        events.push(subscription.next().await.unwrap().unwrap());
    }
    events
}

fn expect_reset(replayed: Result<Vec<u64>, String>, what: &str, reason: &str) {
    match replayed {
        Err(why) => assert!(why.contains(reason), "{what}: {why}"),
        Ok(seqs) => panic!("{what}: replayed {seqs:?} instead of a reset"),
    }
}

async fn run_to_end(local: &Local, run_id: &str, session: &str, message: &str) -> u64 {
    local.submit(run_id, session, message).await;
    let done = local.finished(run_id).await;
    assert_eq!(done.status, RunStatus::Ok, "{done:?}");
    done.last_seq
}

#[tokio::test(start_paused = true)]
async fn a_finished_run_replays_for_the_retention_after_its_end_then_resets() {
    let config = limits(|_| {});
    let retention = config.events.retention;
    assert_eq!(
        retention,
        Duration::from_secs(600),
        "the documented default"
    );
    // Three pieces 100 s apart: the run's log opens 5 minutes before it ends.
    let local = Local::start(Recording::echo(100_000, 3), config).await;
    let last = run_to_end(&local, "kept", "main", "abc").await;
    let whole: Vec<u64> = (1..=last).collect();
    assert_eq!(last, 6, "queued, start, three pieces, end");
    assert_eq!(replay(&local, "kept", 0).await.as_deref(), Ok(&whole[..]));

    // The retention runs from the end: a moment before it, the whole log.
    tokio::time::advance(retention - Duration::from_millis(1)).await;
    assert_eq!(replay(&local, "kept", 0).await.as_deref(), Ok(&whole[..]));
    assert_eq!(replay(&local, "kept", 3).await.as_deref(), Ok(&whole[3..]));
    // Then no position is kept: a reset, reload from history.
    tokio::time::advance(Duration::from_millis(1)).await;
    expect_reset(replay(&local, "kept", 0).await, "from 0", "expired");
    expect_reset(replay(&local, "kept", 3).await, "from 3", "expired");
    // The run itself still answers.
    let snapshot = local.get("kept").await.unwrap();
    assert_eq!(snapshot.status, RunStatus::Ok);
    assert_eq!(snapshot.outcome.text, "abc");
}

#[tokio::test(start_paused = true)]
async fn a_log_keeps_its_newest_events_and_resets_an_older_position() {
    let local = Local::start(Recording::echo(10, 6), limits(|l| l.max_events_per_run = 4)).await;
    local.submit("long", "main", "abcdef").await;
    // Subscribed from the start, and never read while the run goes on.
    let mut lagging = local.coordinator.subscribe_run("long", 0, None).unwrap();
    let done = local.finished("long").await;
    assert_eq!(done.last_seq, 9, "queued, start, six pieces, end");

    // Seqs 6..=9 are kept: from 5 on replays, anything older resets.
    for from in [0, 1, 4] {
        expect_reset(
            replay(&local, "long", from).await,
            &format!("from {from}"),
            "no longer kept",
        );
    }
    assert_eq!(replay(&local, "long", 5).await, Ok(vec![6, 7, 8, 9]));
    assert_eq!(replay(&local, "long", 9).await, Ok(vec![]));
    // What is kept still says the whole text so far.
    let kept = replay_some(&local, "long", 5, 3).await;
    match &kept[2].body {
        EventBody::Assistant { text, .. } => assert_eq!(text, "abcdef"),
        other => panic!("seq 8 is {other:?}"),
    }
    // The subscriber that fell behind is told so, never handed a gap.
    match lagging.next().await {
        Some(Err(reset)) => assert!(reset.reason.contains("fell behind"), "{}", reset.reason),
        other => panic!("the lagging subscriber got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn finished_logs_beyond_the_cap_are_dropped_oldest_finished_first() {
    let holding = Holding::over(Recording::echo(1, 2));
    let release = holding.release.clone();
    let local = Local::start(holding, limits(|l| l.max_retained_runs = 2)).await;
    // Admitted first, finished last.
    let hold = serde_json::json!({"hold": true});
    local.submit_with("active", "held", "held open", hold).await;
    local
        .until("active", "streaming", |s| s.outcome.text == "partial")
        .await;
    for i in 1..=3 {
        run_to_end(&local, &format!("r-{i}"), &format!("s-{i}"), "a b").await;
    }
    expect_reset(replay(&local, "r-1", 0).await, "r-1", "unknown or expired");
    for id in ["r-2", "r-3"] {
        assert_eq!(replay(&local, id, 0).await, Ok(vec![1, 2, 3, 4, 5]), "{id}");
    }
    run_to_end(&local, "r-4", "s-4", "a b").await;
    expect_reset(replay(&local, "r-2", 0).await, "r-2", "unknown or expired");
    // However many finished: the unfinished run's log is whole.
    let kept = replay_some(&local, "active", 0, 3).await;
    let seqs: Vec<u64> = kept.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3], "queued, start, its one delta");

    // Its end makes it the newest finished log: r-3 goes, not it.
    release.cancel();
    let last = local.finished("active").await.last_seq;
    expect_reset(replay(&local, "r-3", 0).await, "r-3", "unknown or expired");
    assert_eq!(replay(&local, "r-4", 0).await, Ok(vec![1, 2, 3, 4, 5]));
    assert_eq!(
        replay(&local, "active", 0).await,
        Ok((1..=last).collect::<Vec<_>>())
    );
}

#[tokio::test(start_paused = true)]
async fn the_all_runs_stream_keeps_its_newest_events() {
    let local = Local::start(Recording::echo(1, 2), limits(|l| l.max_stream_events = 5)).await;
    let mut lagging = local.coordinator.subscribe_all(0, None).unwrap();
    let first = run_to_end(&local, "one", "s-1", "a b").await;
    let second = run_to_end(&local, "two", "s-2", "a b").await;
    let total = first + second;
    assert_eq!(total, 10, "five events a run");

    // The last five are kept: from total - 5 on.
    for from in [0, total - 6] {
        match local.coordinator.subscribe_all(from, None) {
            Err(reset) => assert!(
                reset
                    .reason
                    .contains(&format!("(kept: {}..{total})", total - 4)),
                "from {from}: {}",
                reset.reason
            ),
            Ok(_) => panic!("stream position {from} was served"),
        }
    }
    let mut kept = local
        .coordinator
        .subscribe_all(total - 5, None)
        .expect("the oldest kept position");
    let mut events = Vec::new();
    for _ in 0..5 {
        events.push(kept.next().await.unwrap());
    }
    let stream_seqs: Vec<u64> = events.iter().map(|e| e.stream_seq).collect();
    assert_eq!(stream_seqs, (total - 4..=total).collect::<Vec<_>>());
    let last = events.last().unwrap();
    assert_eq!((last.run_id.as_str(), last.seq), ("two", second));
    // The subscriber that fell behind is told so.
    let reset = lagging.next().await.unwrap_err();
    assert!(reset.reason.contains("fell behind"), "{}", reset.reason);
    // Live only still works, and each run's own log is whole.
    assert!(local.coordinator.subscribe_all(LIVE_ONLY, None).is_ok());
    assert_eq!(replay(&local, "one", 0).await, Ok(vec![1, 2, 3, 4, 5]));
}

/// The real binary with `env` set, over a store of its own in this process
/// (a sandbox without a coordinator); its client, and the sandbox, which
/// serves the store as long as it lives.
async fn binary_with(env: &[(&str, &str)]) -> (Process, RunCoordinatorClient<Channel>, Sandbox) {
    let store = Sandbox::builder().coordinators(0).start().await;
    let mut command = service_command(env!("CARGO_BIN_EXE_run-coordinator"));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store-address", store.store_url()])
        .envs(env.iter().copied());
    let process = Process::start(command, "run-coordinator", "run coordinator serving gRPC").await;
    let client = connect(&process.url()).await;
    (process, client, store)
}

/// Subscribes as a client would; the events until the stream ends, or the
/// reset's reason.
async fn subscribe(
    client: &mut RunCoordinatorClient<Channel>,
    filter: pb::subscribe_request::Filter,
    from_seq: u64,
    take: usize,
) -> Result<Vec<pb::RunEvent>, String> {
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(filter),
            from_seq,
            epoch: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while events.len() < take
        && let Some(item) = stream.message().await.unwrap()
    {
        match item.item.unwrap() {
            pb::subscribe_response::Item::Subscribed(_) => {}
            pb::subscribe_response::Item::Event(event) => events.push(event),
            pb::subscribe_response::Item::Reset(reset) => return Err(reset.reason),
        }
    }
    Ok(events)
}

fn run(id: &str) -> pb::subscribe_request::Filter {
    pb::subscribe_request::Filter::RunId(id.into())
}

fn seqs(events: Result<Vec<pb::RunEvent>, String>) -> Result<Vec<u64>, String> {
    events.map(|events| events.iter().map(|e| e.seq).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_its_event_bounds_from_the_environment() {
    let (mut process, mut client, _store) = binary_with(&[
        ("COORDINATOR_DELTA_INTERVAL", "1ms"),
        ("COORDINATOR_ECHO_PACE", "5ms"),
        ("COORDINATOR_MAX_EVENTS_PER_RUN", "4"),
        ("COORDINATOR_MAX_RETAINED_RUNS", "1"),
        ("COORDINATOR_MAX_STREAM_EVENTS", "3"),
    ])
    .await;
    let six = |id: &str| pb::SubmitRequest {
        options_json: r#"{"chunks":6}"#.into(),
        ..submit_req(id, &format!("session-{id}"), "abcdef")
    };
    submit(&mut client, six("e-1")).await;
    assert_eq!(finished(&mut client, "e-1").await.last_seq, 9);
    // Four events kept per run: seqs 6..=9, so from 4 or older, a reset.
    for from in [0, 4] {
        let reset = seqs(subscribe(&mut client, run("e-1"), from, usize::MAX).await);
        let reset = reset.expect_err("an older position than is kept");
        assert!(reset.contains("no longer kept"), "from {from}: {reset}");
    }
    assert_eq!(
        seqs(subscribe(&mut client, run("e-1"), 5, usize::MAX).await),
        Ok(vec![6, 7, 8, 9])
    );
    // Three in the all-runs stream.
    let all = pb::subscribe_request::Filter::All(true);
    let reset = seqs(subscribe(&mut client, all.clone(), 0, 3).await).unwrap_err();
    assert!(reset.contains("(kept: 7..9)"), "{reset}");
    let kept = subscribe(&mut client, all, 6, 3).await.unwrap();
    assert_eq!(
        kept.iter().map(|e| e.stream_seq).collect::<Vec<_>>(),
        [7, 8, 9]
    );
    // One finished log kept: the next run's end drops e-1's.
    submit(&mut client, six("e-2")).await;
    finished(&mut client, "e-2").await;
    let reset = seqs(subscribe(&mut client, run("e-1"), 5, usize::MAX).await).unwrap_err();
    assert!(reset.contains("unknown or expired"), "{reset}");
    assert_eq!(
        seqs(subscribe(&mut client, run("e-2"), 5, usize::MAX).await),
        Ok(vec![6, 7, 8, 9])
    );
    process.kill().await;

    // A retention of a second: the finished run's log goes (when, the
    // clock says; the test only waits for it, with a deadline).
    let (mut process, mut client, _store) =
        binary_with(&[("COORDINATOR_EVENT_RETENTION", "1s")]).await;
    submit(&mut client, submit_req("brief", "main", "hello")).await;
    let last = finished(&mut client, "brief").await.last_seq;
    let what = "the log of a run that ended to go after a 1 s retention";
    let reset = wait_for(what, DEADLINE, async || {
        match seqs(subscribe(&mut client, run("brief"), 0, usize::MAX).await) {
            Err(reset) => Some(reset),
            Ok(seqs) => {
                assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "whole until it goes");
                None
            }
        }
    })
    .await;
    assert!(reset.contains("expired"), "{reset}");
    process.kill().await;
}

//! Client input at the edges of the contract (issue 9).
//!
//! Subscribe positions: a position past a run's last event, up to
//! `u64::MAX`, is refused with a reset that names the position and the last
//! seq — on a finished run and on a live one — and the coordinator goes on
//! serving Submit and Subscribe afterwards. For the all-runs stream
//! `u64::MAX` keeps its meaning: live only.
//!
//! Error details: a refusal about a run with a long answer carries a
//! trimmed snapshot, so the status fits the HTTP/2 trailers and the
//! client's connection survives.
//!
//! Run timeouts: whatever `timeout_ms` the configuration lets through, up
//! to `u64::MAX`, the run executes (its deadline cannot overflow).

mod common;

use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use common::*;
use run_coordinator::config::CoordinatorConfig;
use tonic::transport::Channel;

const STEP: Duration = Duration::from_secs(10);

fn by_run(run_id: &str, from_seq: u64) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        filter: Some(pb::subscribe_request::Filter::RunId(run_id.into())),
        from_seq,
        epoch: String::new(),
    }
}

/// Every item of a subscription until it ends (bounded by `STEP`), after
/// the `subscribed` item a served subscription starts with.
async fn items(
    client: &mut RunCoordinatorClient<Channel>,
    request: pb::SubscribeRequest,
) -> Vec<pb::subscribe_response::Item> {
    let mut stream = tokio::time::timeout(STEP, client.subscribe(request))
        .await
        .expect("subscribe answered in time")
        .expect("subscribe is a clean stream")
        .into_inner();
    let mut items = Vec::new();
    loop {
        let next = tokio::time::timeout(STEP, stream.message())
            .await
            .expect("the stream moved in time");
        match next
            .expect("no error status")
            .map(|item| item.item.expect("an item"))
        {
            Some(pb::subscribe_response::Item::Subscribed(_)) if items.is_empty() => {}
            Some(item) => items.push(item),
            None => return items,
        }
    }
}

fn assert_refused(items: &[pb::subscribe_response::Item], from_seq: u64, last_seq: u64) {
    let [pb::subscribe_response::Item::Reset(reset)] = items else {
        panic!("from_seq {from_seq}: expected one reset, got {items:?}");
    };
    assert!(
        reset.reason.contains(&format!("position {from_seq}"))
            && reset.reason.contains(&format!("last seq {last_seq}")),
        "from_seq {from_seq}: {:?}",
        reset.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_past_the_last_event_is_refused_and_the_coordinator_goes_on() {
    let cluster = Sandbox::start(Recording::echo(1, 2), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    submit(&mut client, submit_req("known", "main", "hello there")).await;
    let last = finished(&mut client, "known").await.last_seq;
    assert!(last > 0);

    for from_seq in [u64::MAX, u64::MAX - 1, last + 1] {
        assert_refused(
            &items(&mut client, by_run("known", from_seq)).await,
            from_seq,
            last,
        );
    }
    // The last seq itself is a valid position: nothing more, then the end.
    assert!(items(&mut client, by_run("known", last)).await.is_empty());

    // A live run is refused at once too, instead of a stream that waits.
    let mut slow = submit_req("live", "other", "one two three four five");
    slow.options_json = r#"{"chunks": 5, "paceMs": 200}"#.into();
    submit(&mut client, slow).await;
    let refused = items(&mut client, by_run("live", u64::MAX)).await;
    let [pb::subscribe_response::Item::Reset(reset)] = refused.as_slice() else {
        panic!("expected one reset, got {refused:?}");
    };
    assert!(reset.reason.contains("position 18446744073709551615"));

    // Still serving: the all-runs stream from LIVE_ONLY sees a new run, which
    // runs to the end and replays from 0 without a gap.
    let mut all = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::All(true)),
            from_seq: u64::MAX,
            epoch: String::new(),
        })
        .await
        .expect("LIVE_ONLY is a valid all-runs position")
        .into_inner();
    submit(&mut client, submit_req("after", "third", "still here")).await;
    let seen = loop {
        let item = tokio::time::timeout(STEP, all.message())
            .await
            .expect("the all-runs stream moved")
            .expect("no error")
            .expect("the all-runs stream stays open");
        match item.item {
            Some(pb::subscribe_response::Item::Event(event)) if event.run_id == "after" => {
                break event;
            }
            Some(
                pb::subscribe_response::Item::Event(_)
                | pb::subscribe_response::Item::Subscribed(_),
            ) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(seen.seq, 1);
    let done = finished(&mut client, "after").await;
    let replay = items(&mut client, by_run("after", 0)).await;
    let seqs: Vec<u64> = replay
        .iter()
        .map(|item| match item {
            pb::subscribe_response::Item::Event(event) => event.seq,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(seqs, (1..=done.last_seq).collect::<Vec<_>>());
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_about_a_run_with_a_long_answer_stays_small() {
    let cluster = Sandbox::start(Recording::echo(1, 2), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let long = "a long question ".repeat(4096);
    submit(&mut client, submit_req("long", "main", &long)).await;
    finished(&mut client, "long").await;
    // The same key with another message: KEY_REUSED, with the run (whose
    // text is 64 KiB) in the detail.
    let refused = client
        .submit(submit_req("long", "main", "something else"))
        .await
        .expect_err("the key is taken");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
    let detail = run_coordinator_api::grpc::status::detail_of(&refused).expect("a detail");
    assert_eq!(detail.code, pb::ErrorCode::KeyReused as i32);
    let run = detail.run.expect("the existing run");
    assert_eq!(run.run_id, "long");
    assert!(detail.trimmed && run.text.is_empty());
    assert!(
        refused.details().len() <= 8 * 1024,
        "{}",
        refused.details().len()
    );
    // The channel is intact; Get has the whole snapshot.
    let got = client
        .get(pb::GetRequest {
            run_id: "long".into(),
        })
        .await
        .expect("the connection survived")
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got.text, long);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_run_timeout_the_configuration_allows_is_served() {
    // No cap on run timeouts: the client's timeout_ms is taken as it is.
    let config = CoordinatorConfig {
        max_run_timeout: Duration::MAX,
        ..CoordinatorConfig::default()
    };
    let cluster = Sandbox::start(Recording::echo(1, 2), config).await;
    let mut client = cluster.client();
    for (run_id, timeout_ms) in [("i64-max", i64::MAX as u64), ("u64-max", u64::MAX)] {
        let mut req = submit_req(run_id, run_id, "hello there");
        req.timeout_ms = timeout_ms;
        submit(&mut client, req).await;
        let done = finished(&mut client, run_id).await;
        assert_eq!(
            status(&done),
            session_store::model::RunStatus::Ok,
            "{done:?}"
        );
    }
    cluster.finish().await;
}

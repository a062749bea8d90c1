//! Admission and lanes through the real gRPC services (seed experiments A–B,
//! key reuse, the global cap, reject mode, submits cancelled mid-admission).

mod common;

use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use common::*;
use run_coordinator::config::CoordinatorConfig;
use session_store::model::RunStatus;
use tonic::transport::Channel;

async fn same_key_during_a_run_is_in_flight(backend: Backend) {
    let runtime = Recording::echo(40, 4);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let first = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(first.admission, pb::Admission::Accepted as i32);
    assert!(first.accepted_at_ms > 0);
    let again = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(again.admission, pb::Admission::InFlight as i32);
    assert_eq!(again.snapshot.as_ref().unwrap().run_id, "key-a");

    let done = finished(&mut client, "key-a").await;
    assert_eq!(status(&done), RunStatus::Ok);
    assert_eq!(done.text, "hello there");
    assert_eq!(runtime.count("key-a"), 1, "the runtime ran once");
    let entries = transcript(&cluster, "main").await;
    let roles: Vec<&str> = entries.iter().map(|e| e.role.as_str()).collect();
    assert_eq!(roles, vec!["user", "assistant"]);
    assert!(entries.iter().all(|e| e.run_id == "key-a"));

    // Same key after completion: the cached terminal, nothing runs again.
    let cached = submit(&mut client, submit_req("key-a", "main", "hello there")).await;
    assert_eq!(cached.admission, pb::Admission::Completed as i32);
    assert_eq!(cached.snapshot.unwrap().text, "hello there");
    // Same key, different payload: the reuse error, nothing runs.
    let reused = client
        .submit(submit_req("key-a", "main", "something else"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), tonic::Code::AlreadyExists);
    let detail = run_coordinator_api::grpc::status::detail_of(&reused).unwrap();
    assert_eq!(detail.code, pb::ErrorCode::KeyReused as i32);
    assert_eq!(runtime.count("key-a"), 1);
    assert_eq!(transcript(&cluster, "main").await.len(), 2);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_a_same_key_twice_embedded() {
    same_key_during_a_run_is_in_flight(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_a_same_key_twice_postgres() {
    same_key_during_a_run_is_in_flight(Backend::Postgres).await;
}

/// Seed B: ten runs of one session, nine of them submitted concurrently
/// while the first executes. They really queue (each ACK's queue position
/// is its place behind the first), run one at a time in the order the
/// coordinator admitted them, and leave user/assistant pairs, run by run.
async fn one_session_runs_one_at_a_time_in_arrival_order(backend: Backend) {
    let runtime = Recording::echo(5, 3);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    // The first run executes long enough (two pieces 600 ms apart) for
    // the other nine to be admitted behind it.
    let first = pb::SubmitRequest {
        options_json: r#"{"chunks":2,"paceMs":600}"#.into(),
        ..submit_req("b-0", "lane", "message 0")
    };
    let ack = submit(&mut client, first).await;
    assert_eq!(ack.admission, pb::Admission::Accepted as i32);
    until_snapshot(&cluster, "b-0", "b-0 running", |s| {
        status(s) == RunStatus::Running
    })
    .await;
    let acks = futures::future::join_all((1..10).map(|i| {
        let mut client = client.clone();
        async move {
            let id = format!("b-{i}");
            let ack = submit(
                &mut client,
                submit_req(&id, "lane", &format!("message {i}")),
            )
            .await;
            (id, ack)
        }
    }))
    .await;
    let mut admitted: Vec<(u32, String)> = Vec::new();
    for (id, ack) in acks {
        assert_eq!(ack.admission, pb::Admission::Accepted as i32, "{id}");
        let position = ack.snapshot.expect("an ACK has the run").queue_position;
        admitted.push((position, id));
    }
    admitted.sort();
    let positions: Vec<u32> = admitted.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        positions,
        (1..10).collect::<Vec<u32>>(),
        "each queued behind the ones admitted before it: {admitted:?}"
    );
    let mut ids = vec!["b-0".to_owned()];
    ids.extend(admitted.into_iter().map(|(_, id)| id));
    for id in &ids {
        assert_eq!(status(&finished(&mut client, id).await), RunStatus::Ok);
    }
    let executions = runtime.executions();
    let order: Vec<&str> = executions.iter().map(|e| e.run_id.as_str()).collect();
    assert_eq!(
        order,
        ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "admission order"
    );
    for pair in executions.windows(2) {
        assert!(
            pair[0].ended.unwrap() <= pair[1].started,
            "{} overlapped {}",
            pair[0].run_id,
            pair[1].run_id
        );
    }
    // The transcript is user/assistant pairs, run by run, never interleaved.
    let entries = transcript(&cluster, "lane").await;
    assert_eq!(entries.len(), 20);
    for (i, pair) in entries.chunks(2).enumerate() {
        assert_eq!(pair[0].role, "user");
        assert_eq!(pair[1].role, "assistant");
        assert_eq!(pair[0].run_id, ids[i]);
        assert_eq!(pair[1].run_id, ids[i]);
    }
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_b_one_session_runs_one_at_a_time_in_arrival_order_embedded() {
    one_session_runs_one_at_a_time_in_arrival_order(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_b_one_session_runs_one_at_a_time_in_arrival_order_postgres() {
    one_session_runs_one_at_a_time_in_arrival_order(Backend::Postgres).await;
}

async fn the_global_cap_bounds_executing_runs(backend: Backend) {
    let runtime = Recording::echo(20, 3);
    let config = CoordinatorConfig {
        max_executing: 2,
        ..CoordinatorConfig::default()
    };
    let cluster = Sandbox::start_on(backend, runtime.clone(), config).await;
    let mut client = cluster.client();
    for i in 0..6 {
        submit(
            &mut client,
            submit_req(&format!("cap-{i}"), &format!("s{i}"), "x y z"),
        )
        .await;
    }
    for i in 0..6 {
        assert_eq!(
            status(&finished(&mut client, &format!("cap-{i}")).await),
            RunStatus::Ok
        );
    }
    assert_eq!(runtime.executions().len(), 6);
    assert!(
        runtime.max_concurrency() <= 2,
        "{} ran at once",
        runtime.max_concurrency()
    );
    assert_eq!(runtime.max_concurrency(), 2, "the cap was used");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_cap_bounds_executing_runs_embedded() {
    the_global_cap_bounds_executing_runs(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_cap_bounds_executing_runs_postgres() {
    the_global_cap_bounds_executing_runs(Backend::Postgres).await;
}

async fn queue_position_and_reject_mode(backend: Backend) {
    let runtime = Recording::echo(30, 4);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    submit(&mut client, submit_req("q-1", "busy", "first")).await;
    let second = submit(&mut client, submit_req("q-2", "busy", "second")).await;
    let third = submit(&mut client, submit_req("q-3", "busy", "third")).await;
    assert_eq!(status(second.snapshot.as_ref().unwrap()), RunStatus::Queued);
    assert_eq!(second.snapshot.unwrap().queue_position, 1);
    assert_eq!(third.snapshot.unwrap().queue_position, 2);

    let mut reject = submit_req("q-4", "busy", "fourth");
    reject.queue_mode = pb::QueueMode::Reject as i32;
    let busy = client.submit(reject).await.unwrap_err();
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition);
    let detail = run_coordinator_api::grpc::status::detail_of(&busy).unwrap();
    assert_eq!(detail.code, pb::ErrorCode::SessionBusy as i32);
    // Nothing was admitted for the rejected key.
    let got = client
        .get(pb::GetRequest {
            run_id: "q-4".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.snapshot.is_none());
    // On a free session, reject admits.
    let mut free = submit_req("q-5", "idle", "fifth");
    free.queue_mode = pb::QueueMode::Reject as i32;
    assert_eq!(
        submit(&mut client, free).await.admission,
        pb::Admission::Accepted as i32
    );
    for id in ["q-1", "q-2", "q-3", "q-5"] {
        assert_eq!(status(&finished(&mut client, id).await), RunStatus::Ok);
    }
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_position_and_reject_mode_embedded() {
    queue_position_and_reject_mode(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_position_and_reject_mode_postgres() {
    queue_position_and_reject_mode(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submits_are_invalid_argument() {
    let cluster = Sandbox::start(Recording::echo(1, 1), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let mut cases = vec![
        ("empty run id", submit_req("", "main", "hi"), "runId"),
        ("empty message", submit_req("k1", "main", "  "), "message"),
        (
            "malformed key",
            submit_req("k2", "agent:main", "hi"),
            "malformed sessionKey",
        ),
    ];
    let mut options = submit_req("k3", "main", "hi");
    options.options_json = "[1,2]".into();
    cases.push(("options not an object", options, "JSON object"));
    let mut mode = submit_req("k4", "main", "hi");
    mode.queue_mode = 42;
    cases.push(("unknown queue mode", mode, "queue mode"));
    let mut label = submit_req("k5", "main", "hi");
    label.label = Some("l".repeat(513));
    cases.push(("label too long", label, "COORDINATOR_MAX_LABEL_CHARS"));
    let mut label = submit_req("k6", "main", "hi");
    label.label = Some("nul\0".into());
    cases.push(("label with NUL", label, "NUL"));
    let mut requester = submit_req("k7", "main", "hi");
    requester.requester = "r".repeat(257);
    cases.push((
        "requester too long",
        requester,
        "COORDINATOR_MAX_REQUESTER_CHARS",
    ));
    let mut kind = submit_req("k8", "main", "hi");
    kind.kind = "é".repeat(65);
    cases.push(("kind too long", kind, "1..=64 characters"));
    for (what, req, part) in cases {
        let err = client.submit(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}");
        assert!(err.message().contains(part), "{what}: {}", err.message());
    }
    cluster.finish().await;
}

/// Submits `req` with a client deadline of `deadline`: the server sees it
/// as `grpc-timeout` and drops the call when it passes, wherever admission
/// is (before, during or after the durable `CreateRun`).
async fn submit_with_deadline(
    mut client: RunCoordinatorClient<Channel>,
    req: pb::SubmitRequest,
    deadline: Duration,
) -> Result<pb::SubmitResponse, tonic::Status> {
    let mut request = tonic::Request::new(req);
    request.set_timeout(deadline);
    client
        .submit(request)
        .await
        .map(tonic::Response::into_inner)
}

/// A call that must answer: a hang (a half-admitted key) fails the test
/// instead of wedging it.
async fn answers<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .unwrap_or_else(|_| panic!("{what} did not answer: the key is wedged"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_cancelled_during_admission_leave_no_half_admitted_key() {
    let runtime = Recording::echo(1, 1);
    let cluster = Sandbox::start(runtime.clone(), CoordinatorConfig::default()).await;
    // Deadlines from 0 to 5 ms, 250 µs apart: they expire before, during and
    // after the store's CreateRun.
    let deadlines = (0..=20u64).map(|n| Duration::from_micros(n * 250));
    let mut calls = Vec::new();
    for (round, deadline) in deadlines.clone().cycle().take(84).enumerate() {
        // Half of the calls share one key, the others have a key each.
        let (run_id, session) = if round % 2 == 0 {
            ("shared-key".to_owned(), "shared".to_owned())
        } else {
            (format!("own-key-{round}"), format!("own-{round}"))
        };
        let req = submit_req(&run_id, &session, "hello there");
        // A connection per call: a burst of streams reset on one HTTP/2
        // connection makes the server close it (rapid-reset protection), and
        // what is tested here is each call's own cancellation.
        let client = connect(cluster.coordinator_url()).await;
        calls.push((
            run_id,
            session,
            tokio::spawn(submit_with_deadline(client, req, deadline)),
        ));
    }
    let mut keys = Vec::new();
    for (run_id, session, call) in calls {
        match call.await.unwrap() {
            Ok(answer) => assert_eq!(answer.snapshot.unwrap().run_id, run_id),
            Err(status) => assert!(
                matches!(
                    status.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                ),
                "{run_id}: {status:?}"
            ),
        }
        if !keys.contains(&(run_id.clone(), session.clone())) {
            keys.push((run_id, session));
        }
    }

    let mut client = connect(cluster.coordinator_url()).await;
    for (run_id, session) in &keys {
        // Every key is unknown or admitted: a retry answers, and what it
        // answers runs to its end.
        let retry = answers(
            &format!("a retry of {run_id}"),
            submit(&mut client, submit_req(run_id, session, "hello there")),
        )
        .await;
        let admission = pb::Admission::try_from(retry.admission).unwrap();
        assert!(
            matches!(
                admission,
                pb::Admission::Accepted | pb::Admission::InFlight | pb::Admission::Completed
            ),
            "{run_id}: {retry:?}"
        );
        let done = answers(
            &format!("a wait for {run_id}"),
            finished(&mut client, run_id),
        )
        .await;
        assert_eq!(status(&done), RunStatus::Ok, "{run_id}");
        // The store agrees: one record, terminal.
        let record = session_store::SessionStore::get_run(&cluster.store, run_id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{run_id} has no durable record"));
        assert!(record.status.is_terminal(), "{run_id}: {record:?}");
        // A cancel of the session answers too (it waits on admissions).
        answers(
            &format!("a cancel of session {session}"),
            client.cancel(pb::CancelRequest {
                target: Some(pb::cancel_request::Target::SessionKey(session.clone())),
                requester: "tester".into(),
            }),
        )
        .await
        .unwrap();
        assert_eq!(runtime.count(run_id), 1, "{run_id} ran once");
    }
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_are_admitted_within_their_limits() {
    let config = run_coordinator::config::CoordinatorConfig {
        max_attachment_bytes: 4,
        max_attachments: 1,
        ..Default::default()
    };
    let cluster = Sandbox::start(Recording::echo(1, 4), config).await;
    let file = |mime: &str, data: &[u8]| clawgate_proto::agent_runtime::v1::Attachment {
        mime_type: mime.into(),
        file_name: "f".into(),
        data: data.to_vec(),
    };
    let with = |id: &str, files| clawgate_proto::run_coordinator::v1::SubmitRequest {
        attachments: files,
        ..submit_req(id, "agent:main:files", "")
    };
    // An attachment alone is a message.
    let done = submit(
        &mut cluster.client(),
        with("a-1", vec![file("image/png", b"1234")]),
    )
    .await;
    assert_eq!(
        done.admission,
        clawgate_proto::run_coordinator::v1::Admission::Accepted as i32
    );
    assert_eq!(
        status(&finished(&mut cluster.client(), "a-1").await),
        session_store::model::RunStatus::Ok
    );
    for (id, files, why) in [
        (
            "a-2",
            vec![file("image/png", b"12345")],
            "COORDINATOR_MAX_ATTACHMENT_BYTES",
        ),
        (
            "a-3",
            vec![file("image/png", b"1"), file("image/png", b"2")],
            "COORDINATOR_MAX_ATTACHMENTS",
        ),
        ("a-4", vec![file("png", b"1")], "type/subtype"),
        ("a-5", vec![], "must not be empty"),
    ] {
        let refused = cluster.client().submit(with(id, files)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{id}");
        assert!(
            refused.message().contains(why),
            "{id}: {}",
            refused.message()
        );
    }
    cluster.finish().await;
}

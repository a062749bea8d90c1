//! Supersede, cancel, detached execution, wait and replay through the real
//! gRPC services (seed experiments C and D; acceptance 7–9).

mod common;

use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use common::*;
use run_coordinator::config::CoordinatorConfig;
use session_store::SessionStore;
use session_store::model::RunStatus;

fn with_options(mut req: pb::SubmitRequest, options: serde_json::Value) -> pb::SubmitRequest {
    req.options_json = options.to_string();
    req
}

/// Waits until the run has streamed some assistant text.
async fn until_text(cluster: &Sandbox, run_id: &str) -> pb::RunSnapshot {
    until_snapshot(cluster, run_id, "never streamed", |s| !s.text.is_empty()).await
}

async fn interrupt_supersedes_the_active_run(backend: Backend) {
    let runtime = Recording::echo(30, 10);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    // The old run ignores cancellation: its runtime keeps emitting.
    let old = with_options(
        submit_req("old", "main", "a long answer that keeps going"),
        serde_json::json!({"ignoreCancel": true}),
    );
    submit(&mut client, old).await;
    let old_running = until_text(&cluster, "old").await;
    let mut new = submit_req("new", "main", "now this");
    new.queue_mode = pb::QueueMode::Interrupt as i32;
    let ack = submit(&mut client, new).await;
    assert_eq!(ack.admission, pb::Admission::Accepted as i32);

    let old_done = finished(&mut client, "old").await;
    assert_eq!(status(&old_done), RunStatus::Superseded);
    assert_eq!(old_done.superseded_by.as_deref(), Some("new"));
    let new_done = finished(&mut client, "new").await;
    assert_eq!(status(&new_done), RunStatus::Ok);
    assert!(new_done.fence_token.unwrap() > old_running.fence_token.unwrap());

    // A late append with the old fence is refused by the store.
    let late = append_with_fence_of(&cluster.store, &old_running)
        .await
        .unwrap_err();
    assert_eq!(late.code(), "STALE_WRITER");
    // The whole transcript: old's user turn, then new's turn; nothing of
    // old's answer, which kept coming after it was superseded.
    assert_eq!(
        turns(&cluster, "main").await,
        ["old:user", "new:user", "new:assistant"]
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_c_interrupt_supersedes_the_active_run_embedded() {
    interrupt_supersedes_the_active_run(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_c_interrupt_supersedes_the_active_run_postgres() {
    interrupt_supersedes_the_active_run(Backend::Postgres).await;
}

/// A session's transcript as "run:role" entries.
async fn turns(cluster: &Sandbox, session: &str) -> Vec<String> {
    transcript(cluster, session)
        .await
        .into_iter()
        .map(|e| format!("{}:{}", e.run_id, e.role))
        .collect()
}

/// Seed C from the coordinator's side: the writer slot is taken over in the
/// store behind the coordinator's back (as a newer owner would), so the
/// running run's own next write is refused for its stale fence, and the
/// coordinator ends it `superseded` by the run that holds the slot, writing
/// nothing more of it.
async fn a_stale_append_of_the_running_run_ends_it_superseded(backend: Backend) {
    use session_store::model::{AcquireMode, AcquireWriter, ExpectedSession};
    let runtime = Recording::echo(30, 10);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let old = submit_req("old", "main", "a long answer that keeps going");
    submit(&mut client, old).await;
    let running = until_text(&cluster, "old").await;
    let key = session_store::SessionKey::parse("main").unwrap();
    let table = cluster.store.list_leases().await.unwrap();
    let partition = clawgate_common::partition::partition_of(key.as_str(), table.partition_count);
    let taken = cluster
        .store
        .acquire_writer(AcquireWriter {
            key: key.clone(),
            expected_session: ExpectedSession::Current,
            expected_writer: None,
            run_id: "usurper".into(),
            mode: AcquireMode::Takeover,
            label: None,
            owner_token: table.leases[partition as usize].token(),
        })
        .await
        .unwrap();
    assert_eq!(taken.superseded_run_id.as_deref(), Some("old"));
    assert!(taken.fence_token > running.fence_token.unwrap());

    let done = finished(&mut client, "old").await;
    assert_eq!(status(&done), RunStatus::Superseded, "{done:?}");
    assert_eq!(done.superseded_by.as_deref(), Some("usurper"));
    // The slot is the usurper's still: the old run did not release it.
    let session = cluster.store.get_session(&key).await.unwrap().unwrap();
    assert_eq!(session.active_writer_run_id.as_deref(), Some("usurper"));
    assert_eq!(turns(&cluster, "main").await, ["old:user"]);
    assert_eq!(runtime.count("old"), 1);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_c_a_stale_append_of_the_running_run_ends_it_superseded_embedded() {
    a_stale_append_of_the_running_run_ends_it_superseded(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_c_a_stale_append_of_the_running_run_ends_it_superseded_postgres() {
    a_stale_append_of_the_running_run_ends_it_superseded(Backend::Postgres).await;
}

async fn a_dropped_client_does_not_cancel_the_run(backend: Backend) {
    let runtime = Recording::echo(20, 5);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    {
        // Its own connection, dropped right after the ACK.
        let mut submitter = connect(cluster.coordinator_url()).await;
        submit(
            &mut submitter,
            submit_req("detached", "main", "finish without me"),
        )
        .await;
    }
    let mut observer = connect(cluster.coordinator_url()).await;
    let done = finished(&mut observer, "detached").await;
    assert_eq!(status(&done), RunStatus::Ok);
    assert_eq!(done.text, "finish without me");

    // Dropped before the ACK: the Submit is cancelled in flight, at several
    // moments (before it leaves, during admission, after). Whatever it got
    // to, the client's retry with the same key answers, and the run
    // executes exactly once, to its end.
    for (n, delay_us) in [0u64, 200, 500, 1_000, 2_000, 5_000]
        .into_iter()
        .enumerate()
    {
        let run_id = format!("dropped-{n}");
        let session = format!("dropped-session-{n}");
        let mut submitter = connect(cluster.coordinator_url()).await;
        let request = submit_req(&run_id, &session, "finish without me");
        tokio::select! {
            _ = submitter.submit(request) => {}
            () = tokio::time::sleep(Duration::from_micros(delay_us)) => {}
        }
        drop(submitter);
        let retry = submit(
            &mut observer,
            submit_req(&run_id, &session, "finish without me"),
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
        let done = finished(&mut observer, &run_id).await;
        assert_eq!(status(&done), RunStatus::Ok, "{run_id}");
        assert_eq!(runtime.count(&run_id), 1, "{run_id} ran once");
    }
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_d_a_dropped_client_does_not_cancel_the_run_embedded() {
    a_dropped_client_does_not_cancel_the_run(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_d_a_dropped_client_does_not_cancel_the_run_postgres() {
    a_dropped_client_does_not_cancel_the_run(Backend::Postgres).await;
}

async fn cancel_queued_and_running_runs(backend: Backend) {
    let runtime = Recording::echo(30, 20);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let running = with_options(
        submit_req(
            "running",
            "main",
            "one two three four five six seven eight nine ten",
        ),
        serde_json::json!({"ignoreCancel": true}),
    );
    submit(&mut client, running).await;
    submit(&mut client, submit_req("queued", "main", "never runs")).await;
    until_text(&cluster, "running").await;

    // Cancel while queued: aborted, never executed.
    let cancelled = cancel_run(&mut client, "queued").await;
    assert_eq!(status(&cancelled.runs[0]), RunStatus::Aborted);
    // Cancel while running (the runtime ignores it and would finish "ok").
    let cancelled = cancel_run(&mut client, "running").await;
    let aborted = &cancelled.runs[0];
    assert_eq!(status(aborted), RunStatus::Aborted);
    assert!(!aborted.text.is_empty(), "partial text kept");

    // Cancelling again changes nothing; so does the runtime's late success.
    let again = cancel_run(&mut client, "running").await;
    assert_eq!(again.runs[0], *aborted);
    let record = cluster.store.get_run("running").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Aborted);
    assert_eq!(runtime.count("queued"), 0, "the queued run never executed");
    wait_until(
        "the running run's runtime stopped being read",
        DEADLINE,
        || {
            runtime
                .executions()
                .iter()
                .any(|e| e.run_id == "running" && e.ended.is_some())
        },
    )
    .await;
    assert_eq!(
        status(&finished(&mut client, "running").await),
        RunStatus::Aborted
    );

    // The partial assistant text is in the transcript, marked aborted.
    let last = transcript(&cluster, "main").await.pop().unwrap();
    assert_eq!(last.run_id, "running");
    assert_eq!(last.role, "assistant");
    assert!(last.metadata.aborted);
    assert_eq!(last.metadata.stop_reason.as_deref(), Some("aborted"));
    assert!(last.content_json.contains(&aborted.text));
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_and_running_runs_embedded() {
    cancel_queued_and_running_runs(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_and_running_runs_postgres() {
    cancel_queued_and_running_runs(Backend::Postgres).await;
}

async fn cancel_by_session_aborts_every_unfinished_run(backend: Backend) {
    let runtime = Recording::echo(30, 20);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    for id in ["s-1", "s-2", "s-3"] {
        submit(&mut client, submit_req(id, "abort-me", "a b c d e f g h")).await;
    }
    until_text(&cluster, "s-1").await;
    let cancelled = client
        .cancel(pb::CancelRequest {
            target: Some(pb::cancel_request::Target::SessionKey("abort-me".into())),
            requester: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let statuses: Vec<RunStatus> = cancelled.runs.iter().map(status).collect();
    assert_eq!(statuses, vec![RunStatus::Aborted; 3]);
    assert_eq!(runtime.count("s-2") + runtime.count("s-3"), 0);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_session_aborts_every_unfinished_run_embedded() {
    cancel_by_session_aborts_every_unfinished_run(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_session_aborts_every_unfinished_run_postgres() {
    cancel_by_session_aborts_every_unfinished_run(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_observes_and_many_waiters_resolve() {
    let runtime = Recording::echo(40, 5);
    let cluster = Sandbox::start(runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    submit(
        &mut client,
        submit_req("observed", "main", "take your time"),
    )
    .await;
    let early = wait(&mut client, "observed", 1).await;
    assert!(!early.terminal);
    assert!(!early.unknown);
    let snapshot = early.snapshot.unwrap();
    assert!(matches!(
        status(&snapshot),
        RunStatus::Queued | RunStatus::Running
    ));

    let waiters: Vec<_> = (0..100)
        .map(|_| {
            let mut client = cluster.client();
            tokio::spawn(async move { wait(&mut client, "observed", 60_000).await })
        })
        .collect();
    for waiter in waiters {
        let done = waiter.await.unwrap();
        assert!(done.terminal);
        assert_eq!(
            status(done.snapshot.as_ref().unwrap()),
            RunStatus::Ok,
            "the timed-out wait changed nothing"
        );
    }
    // An unknown run: a timeout flagged unknown.
    let unknown = wait(&mut client, "nobody", 50).await;
    assert!(!unknown.terminal);
    assert!(unknown.unknown);
    assert!(unknown.snapshot.is_none());
    cluster.finish().await;
}

async fn collect_events(
    client: &mut clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient<
        tonic::transport::Channel,
    >,
    run_id: &str,
    from_seq: u64,
    take: Option<usize>,
) -> Vec<pb::RunEvent> {
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::RunId(run_id.into())),
            from_seq,
            epoch: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    // A subscription that can be served says so first, before any event.
    let first = stream.message().await.unwrap().unwrap().item.unwrap();
    assert!(
        matches!(first, pb::subscribe_response::Item::Subscribed(_)),
        "{first:?}"
    );
    let mut events = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        match item.item.unwrap() {
            pb::subscribe_response::Item::Event(event) => events.push(event),
            pb::subscribe_response::Item::Reset(reset) => panic!("unexpected reset: {reset:?}"),
            pb::subscribe_response::Item::Subscribed(s) => panic!("a second subscribed: {s:?}"),
        }
        if take.is_some_and(|n| events.len() == n) {
            break;
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_a_seq_mid_run_has_no_gap_and_no_duplicate() {
    let runtime = Recording::echo(25, 12);
    let config = CoordinatorConfig {
        delta_interval: Duration::from_millis(1),
        ..CoordinatorConfig::default()
    };
    let cluster = Sandbox::start(runtime.clone(), config).await;
    let mut client = cluster.client();
    submit(
        &mut client,
        with_options(
            submit_req("replayed", "main", "abcdefghijkl"),
            serde_json::json!({"toolCall": true}),
        ),
    )
    .await;
    // Read a few events, then disconnect mid-run.
    let first = collect_events(&mut client, "replayed", 0, Some(4)).await;
    let k = first.last().unwrap().seq;
    assert_eq!(
        first.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=k).collect::<Vec<_>>()
    );
    // A new subscription from k continues at k + 1 until the end.
    let rest = collect_events(&mut client, "replayed", k, None).await;
    assert_eq!(rest.first().unwrap().seq, k + 1);
    for pair in rest.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1, "gap or duplicate");
    }
    let done = finished(&mut client, "replayed").await;
    assert_eq!(rest.last().unwrap().seq, done.last_seq);
    // The last event is the lifecycle end; assistant events carry text so far.
    let last = rest.last().unwrap();
    assert!(
        matches!(last.body, Some(pb::run_event::Body::Lifecycle(ref l)) if l.phase == pb::lifecycle::Phase::End as i32)
    );
    let texts: Vec<String> = first
        .iter()
        .chain(&rest)
        .filter_map(|e| match &e.body {
            Some(pb::run_event::Body::Assistant(a)) => Some(a.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts.last().map(String::as_str), Some("abcdefghijkl"));
    // A replay of the whole finished run from 0 is the same sequence.
    let all = collect_events(&mut client, "replayed", 0, None).await;
    assert_eq!(all.len() as u64, done.last_seq);
    // Another epoch is answered with a reset.
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::RunId("replayed".into())),
            from_seq: 0,
            epoch: "some-old-epoch".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let item = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        item.item,
        Some(pb::subscribe_response::Item::Reset(_))
    ));
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_timeout_is_terminal_timeout() {
    let runtime = Recording::echo(50, 50);
    let cluster = Sandbox::start(runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    let mut req = submit_req("slow", "main", "this will not finish in time at all");
    req.timeout_ms = 120;
    submit(&mut client, req).await;
    let done = finished(&mut client, "slow").await;
    assert_eq!(status(&done), RunStatus::Timeout);
    assert_eq!(done.error.unwrap().kind, "timeout");
    wait_until("the runtime was cancelled", DEADLINE, || {
        runtime
            .executions()
            .iter()
            .any(|e| e.ended.is_some() && e.cancelled)
    })
    .await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_stops_admission_and_lets_running_runs_finish() {
    let runtime = Recording::echo(20, 5);
    let cluster = Sandbox::start(runtime.clone(), CoordinatorConfig::default()).await;
    let mut client = cluster.client();
    submit(
        &mut client,
        submit_req("before", "main", "finishes during the drain"),
    )
    .await;
    until_text(&cluster, "before").await;
    let coordinator = cluster.coordinator().clone();
    let drained = tokio::spawn(async move { coordinator.drain(Duration::from_secs(30)).await });
    // Admission closes as soon as the drain task has started.
    let mut attempt = 0;
    let refused = loop {
        attempt += 1;
        let late = submit_req(&format!("after-{attempt}"), "other", "too late");
        if let Err(status) = client.submit(late).await {
            break status;
        }
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let detail = run_coordinator_api::grpc::status::detail_of(&refused).unwrap();
    assert_eq!(detail.code, pb::ErrorCode::Draining as i32);
    drained.await.unwrap();
    let done = finished(&mut client, "before").await;
    assert_eq!(
        status(&done),
        RunStatus::Ok,
        "the running run finished within the deadline"
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    let cluster = Sandbox::start(Recording::echo(1, 1), CoordinatorConfig::default()).await;
    let channel = tonic::transport::Endpoint::from_shared(cluster.coordinator_url().to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "clawgate.run_coordinator.v1.RunCoordinator".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Both reflection versions list exactly what this server serves (not
    // the store or the runtime, whose descriptors share the set).
    clawgate_system_tests::reflection::assert_lists_exactly(
        cluster.coordinator_url(),
        &["clawgate.run_coordinator.v1.RunCoordinator"],
    )
    .await;
    cluster.finish().await;
}

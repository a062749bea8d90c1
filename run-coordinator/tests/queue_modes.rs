//! The four queue modes a message sent to a busy session can have, against
//! the invariants every mode keeps: one writer per session at a time, no
//! interleaved turns, every message in the transcript exactly once and in
//! arrival order, a retried key never delivered twice.
//!
//! - `followup` (ENQUEUE): a turn of its own after the active one.
//! - `steer`: into the active run at its next model boundary (the runtime
//!   answers it in the same turn), a turn of its own when the session is
//!   idle or the runtime never takes it.
//! - `collect`: the collect messages waiting together are one next turn.
//! - `interrupt`: supersedes the active run.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_proto::run_coordinator::v1 as pb;
use common::*;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::{AgentRuntime, RuntimeError, RuntimeRequest, RuntimeStream};
use session_store::model::{RunStatus, TranscriptEntry};
use tokio_util::sync::CancellationToken;

const SESSION: &str = "agent:main:queue-modes";

fn send(run_id: &str, message: &str, mode: pb::QueueMode) -> pb::SubmitRequest {
    pb::SubmitRequest {
        kind: "chat".into(),
        queue_mode: mode as i32,
        ..submit_req(run_id, SESSION, message)
    }
}

/// The transcript as `(role, text)` pairs.
fn turns(entries: &[TranscriptEntry]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|e| {
            let parts: serde_json::Value = serde_json::from_str(&e.content_json).unwrap();
            let text = parts
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<String>();
            (e.role.clone(), text)
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .collect()
}

/// Submits `message` as a followup and waits until it executes: the
/// session is busy from then on.
async fn busy(cluster: &mut Sandbox, run_id: &str, message: &str) {
    submit(
        &mut cluster.client(),
        send(run_id, message, pb::QueueMode::Enqueue),
    )
    .await;
    until_snapshot(cluster, run_id, "never ran", |s| {
        status(s) == RunStatus::Running
    })
    .await;
}

/// Echo slow enough that a second message arrives while the first streams.
fn slow_echo() -> Arc<Recording> {
    Recording::echo(40, 1000)
}

async fn followup_is_a_turn_of_its_own_after_the_active_one(backend: Backend) {
    let runtime = slow_echo();
    let mut cluster =
        Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    busy(&mut cluster, "f-1", "first message").await;
    submit(
        &mut cluster.client(),
        send("f-2", "second", pb::QueueMode::Enqueue),
    )
    .await;
    for id in ["f-1", "f-2"] {
        assert_eq!(
            status(&finished(&mut cluster.client(), id).await),
            RunStatus::Ok
        );
    }
    assert_eq!(
        turns(&transcript(&cluster, SESSION).await),
        pairs(&[
            ("user", "first message"),
            ("assistant", "first message"),
            ("user", "second"),
            ("assistant", "second"),
        ])
    );
    assert_eq!(runtime.count("f-1") + runtime.count("f-2"), 2);
    assert_eq!(runtime.max_concurrency(), 1, "one writer at a time");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followup_is_a_turn_of_its_own_after_the_active_one_embedded() {
    followup_is_a_turn_of_its_own_after_the_active_one(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followup_is_a_turn_of_its_own_after_the_active_one_postgres() {
    followup_is_a_turn_of_its_own_after_the_active_one(Backend::Postgres).await;
}

async fn steer_goes_into_the_active_run_at_its_next_boundary(backend: Backend) {
    let runtime = slow_echo();
    let mut cluster =
        Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    busy(&mut cluster, "s-1", "tell me a story").await;
    let steered = submit(
        &mut cluster.client(),
        send("s-2", "make it short", pb::QueueMode::Steer),
    )
    .await;
    assert_eq!(steered.admission, pb::Admission::Accepted as i32);
    // The same key again is the same delivery, not a second steer.
    let again = submit(
        &mut cluster.client(),
        send("s-2", "make it short", pb::QueueMode::Steer),
    )
    .await;
    assert_ne!(again.admission, pb::Admission::Accepted as i32);

    let carrier = finished(&mut cluster.client(), "s-1").await;
    let companion = finished(&mut cluster.client(), "s-2").await;
    assert_eq!(status(&carrier), RunStatus::Ok);
    assert_eq!(
        status(&companion),
        RunStatus::Ok,
        "it ends with the run it steered"
    );
    assert_eq!(companion.text, carrier.text);
    assert_eq!(carrier.text, "tell me a story\n\nmake it short");
    assert_eq!(
        turns(&transcript(&cluster, SESSION).await),
        pairs(&[
            ("user", "tell me a story"),
            ("assistant", "tell me a story"),
            ("user", "make it short"),
            ("assistant", "make it short"),
        ])
    );
    // One turn of the runtime answered both.
    assert_eq!(runtime.count("s-1"), 1);
    assert_eq!(runtime.count("s-2"), 0);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_goes_into_the_active_run_at_its_next_boundary_embedded() {
    steer_goes_into_the_active_run_at_its_next_boundary(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_goes_into_the_active_run_at_its_next_boundary_postgres() {
    steer_goes_into_the_active_run_at_its_next_boundary(Backend::Postgres).await;
}

async fn steer_into_an_idle_session_is_a_turn(backend: Backend) {
    let runtime = Recording::echo(1, 4);
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    submit(
        &mut cluster.client(),
        send("i-1", "hello", pb::QueueMode::Steer),
    )
    .await;
    assert_eq!(
        status(&finished(&mut cluster.client(), "i-1").await),
        RunStatus::Ok
    );
    assert_eq!(runtime.count("i-1"), 1);
    assert_eq!(
        turns(&transcript(&cluster, SESSION).await),
        pairs(&[("user", "hello"), ("assistant", "hello")])
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_into_an_idle_session_is_a_turn_embedded() {
    steer_into_an_idle_session_is_a_turn(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_into_an_idle_session_is_a_turn_postgres() {
    steer_into_an_idle_session_is_a_turn(Backend::Postgres).await;
}

/// A runtime that never takes a steered message (as one written before
/// steering, or one that never reaches a boundary in time).
struct Deaf(Arc<Recording>);

#[async_trait]
impl AgentRuntime for Deaf {
    fn name(&self) -> &'static str {
        "deaf"
    }

    async fn execute(
        &self,
        mut request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        request.inputs = Default::default();
        self.0.execute(request, cancel).await
    }
}

async fn a_steer_the_runtime_never_takes_is_the_next_turn(backend: Backend) {
    let runtime = slow_echo();
    let deaf = Arc::new(Deaf(runtime.clone()));
    let mut cluster = Sandbox::start_on(backend, deaf, CoordinatorConfig::default()).await;
    busy(&mut cluster, "d-1", "first message").await;
    submit(
        &mut cluster.client(),
        send("d-2", "steered", pb::QueueMode::Steer),
    )
    .await;
    // Sent after the steer: it must come after it.
    submit(
        &mut cluster.client(),
        send("d-3", "later", pb::QueueMode::Enqueue),
    )
    .await;
    for id in ["d-1", "d-2", "d-3"] {
        assert_eq!(
            status(&finished(&mut cluster.client(), id).await),
            RunStatus::Ok
        );
    }
    assert_eq!(
        turns(&transcript(&cluster, SESSION).await),
        pairs(&[
            ("user", "first message"),
            ("assistant", "first message"),
            ("user", "steered"),
            ("assistant", "steered"),
            ("user", "later"),
            ("assistant", "later"),
        ])
    );
    assert_eq!(runtime.max_concurrency(), 1);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_the_runtime_never_takes_is_the_next_turn_embedded() {
    a_steer_the_runtime_never_takes_is_the_next_turn(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_the_runtime_never_takes_is_the_next_turn_postgres() {
    a_steer_the_runtime_never_takes_is_the_next_turn(Backend::Postgres).await;
}

async fn collect_folds_the_waiting_messages_into_one_turn(backend: Backend) {
    let runtime = slow_echo();
    let mut cluster =
        Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    busy(&mut cluster, "c-0", "busy now").await;
    for (id, text) in [("c-1", "one"), ("c-2", "two"), ("c-3", "three")] {
        submit(
            &mut cluster.client(),
            send(id, text, pb::QueueMode::Collect),
        )
        .await;
    }
    let snapshots: Vec<pb::RunSnapshot> = {
        let mut all = Vec::new();
        for id in ["c-0", "c-1", "c-2", "c-3"] {
            all.push(finished(&mut cluster.client(), id).await);
        }
        all
    };
    assert!(snapshots.iter().all(|s| status(s) == RunStatus::Ok));
    // One turn answered the three: the carrier's text is theirs.
    assert_eq!(snapshots[1].text, "one\n\ntwo\n\nthree");
    assert_eq!(snapshots[2].text, snapshots[1].text);
    assert_eq!(snapshots[3].text, snapshots[1].text);
    assert_eq!(runtime.count("c-1"), 1);
    assert_eq!(runtime.count("c-2") + runtime.count("c-3"), 0);
    assert_eq!(
        turns(&transcript(&cluster, SESSION).await),
        pairs(&[
            ("user", "busy now"),
            ("assistant", "busy now"),
            ("user", "one"),
            ("user", "two"),
            ("user", "three"),
            ("assistant", "one\n\ntwo\n\nthree"),
        ])
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_folds_the_waiting_messages_into_one_turn_embedded() {
    collect_folds_the_waiting_messages_into_one_turn(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_folds_the_waiting_messages_into_one_turn_postgres() {
    collect_folds_the_waiting_messages_into_one_turn(Backend::Postgres).await;
}

async fn interrupt_supersedes_the_active_run(backend: Backend) {
    let runtime = slow_echo();
    let cluster = Sandbox::start_on(backend, runtime.clone(), CoordinatorConfig::default()).await;
    submit(
        &mut cluster.client(),
        send("x-1", "a long answer please", pb::QueueMode::Enqueue),
    )
    .await;
    wait_until("x-1 executes", DEADLINE, || runtime.count("x-1") == 1).await;
    submit(
        &mut cluster.client(),
        send("x-2", "stop, this instead", pb::QueueMode::Interrupt),
    )
    .await;
    let old = finished(&mut cluster.client(), "x-1").await;
    let new = finished(&mut cluster.client(), "x-2").await;
    assert_eq!(status(&old), RunStatus::Superseded);
    assert_eq!(old.superseded_by.as_deref(), Some("x-2"));
    assert_eq!(status(&new), RunStatus::Ok);
    let entries = turns(&transcript(&cluster, SESSION).await);
    // Each message once, in order; the superseded run wrote nothing after
    // the new one took the session over.
    let users: Vec<&str> = entries
        .iter()
        .filter(|(role, _)| role == "user")
        .map(|(_, text)| text.as_str())
        .collect();
    assert_eq!(users, ["a long answer please", "stop, this instead"]);
    assert_eq!(
        entries.last().unwrap(),
        &("assistant".to_owned(), "stop, this instead".to_owned())
    );
    let old_execution = runtime
        .executions()
        .into_iter()
        .find(|e| e.run_id == "x-1")
        .unwrap();
    assert!(old_execution.cancelled, "the old run was cut short");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_supersedes_the_active_run_embedded() {
    interrupt_supersedes_the_active_run(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_supersedes_the_active_run_postgres() {
    interrupt_supersedes_the_active_run(Backend::Postgres).await;
}

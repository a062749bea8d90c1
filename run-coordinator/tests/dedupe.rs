//! The in-memory dedupe table (`--dedupe-ttl`, `--dedupe-capacity`) through
//! the coordinator's public API, in paused tokio time: a finished run leaves
//! it after the TTL or beyond the capacity, oldest first, and the durable
//! record answers for it from then on; an unfinished run (queued or
//! running) never leaves it, however small the table.
//!
//! Whether a run is still in the table shows in the store: a `Get` of a run
//! in memory reads nothing from the store, a `Get` of one that left reads
//! its record (`get_run`), and a retry of a key in memory is answered
//! without a `CreateRun`.

mod common;

use std::time::Duration;

use common::*;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator_api::model::{Admission, CancelTarget, RunStatus};

fn config(ttl: Duration, capacity: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        dedupe_ttl: ttl,
        dedupe_capacity: capacity,
        // Nothing here may time out while virtual time jumps.
        default_run_timeout: Duration::from_secs(7 * 86_400),
        ..CoordinatorConfig::default()
    }
}

/// `Get`s `run_id` and returns the snapshot and how many records the store
/// read for it (0: the run was in memory; 1: it had left the table).
async fn get_counting(
    local: &Local,
    run_id: &str,
) -> (run_coordinator_api::model::RunSnapshot, u64) {
    let before = local.served("get_run");
    let snapshot = local
        .get(run_id)
        .await
        .unwrap_or_else(|| panic!("{run_id} is unknown"));
    (snapshot, local.served("get_run") - before)
}

/// Submits `run_id` and waits for its end.
async fn run_to_end(local: &Local, run_id: &str, session: &str) {
    local.submit(run_id, session, "hello there").await;
    assert_eq!(local.finished(run_id).await.status, RunStatus::Ok);
}

#[tokio::test(start_paused = true)]
async fn a_finished_run_leaves_the_dedupe_table_after_its_ttl() {
    let runtime = Recording::echo(1, 2);
    let local = Local::start(runtime.clone(), config(Duration::from_secs(60), 1000)).await;
    run_to_end(&local, "t-1", "one").await;
    let (done, reads) = get_counting(&local, "t-1").await;
    assert_eq!(reads, 0, "a run that just finished is answered from memory");

    // Just inside the TTL: another run's admission and end (each sweeps the
    // table) leave t-1 where it is.
    tokio::time::advance(Duration::from_secs(59)).await;
    run_to_end(&local, "t-2", "two").await;
    let (_, reads) = get_counting(&local, "t-1").await;
    assert_eq!(reads, 0, "t-1 left the table before its TTL");

    // Past it: the next sweep takes t-1 out, and only t-1.
    tokio::time::advance(Duration::from_secs(1)).await;
    run_to_end(&local, "t-3", "three").await;
    let (from_record, reads) = get_counting(&local, "t-1").await;
    assert_eq!(reads, 1, "t-1 is still in the table after its TTL");
    assert_eq!(from_record.status, RunStatus::Ok);
    assert_eq!(from_record.outcome.text, done.outcome.text);
    assert_eq!(
        get_counting(&local, "t-2").await.1,
        0,
        "t-2 is within its TTL"
    );

    // The durable record answers a retry: completed, nothing runs again.
    let retry = local.submit("t-1", "one", "hello there").await;
    assert_eq!(retry.admission, Admission::Completed);
    assert_eq!(retry.snapshot.status, RunStatus::Ok);
    assert_eq!(runtime.count("t-1"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_dedupe_table_keeps_the_newest_finished_runs_up_to_its_capacity() {
    let runtime = Recording::echo(1, 2);
    let local = Local::start(runtime.clone(), config(Duration::from_secs(3600), 2)).await;
    for i in 1..=4 {
        run_to_end(&local, &format!("c-{i}"), &format!("s-{i}")).await;
    }
    // Two finished runs fit: the two that finished first went, oldest first.
    let mut reads = Vec::new();
    for i in 1..=4 {
        let (snapshot, read) = get_counting(&local, &format!("c-{i}")).await;
        assert_eq!(snapshot.status, RunStatus::Ok);
        reads.push(read);
    }
    assert_eq!(
        reads,
        [1, 1, 0, 0],
        "which of c-1..c-4 the store answered for"
    );

    // A retry of an evicted key is answered by its record, without running.
    let creates = local.served("create_run");
    let retry = local.submit("c-1", "s-1", "hello there").await;
    assert_eq!(retry.admission, Admission::Completed);
    assert_eq!(
        local.served("create_run"),
        creates + 1,
        "the record answered"
    );
    // A retry of a key still in memory does not reach the store at all.
    let retry = local.submit("c-4", "s-4", "hello there").await;
    assert_eq!(retry.admission, Admission::Completed);
    assert_eq!(local.served("create_run"), creates + 1, "memory answered");
    for i in 1..=4 {
        assert_eq!(runtime.count(&format!("c-{i}")), 1, "c-{i} ran once");
    }
}

/// Regression: a finished run rebuilt from its record (once it left the
/// table) answered Wait and a retried Submit with `last_seq` 0, "no events
/// yet", while `Get` said otherwise and its event log, still kept, had
/// every event.
#[tokio::test(start_paused = true)]
async fn a_run_answered_by_its_record_keeps_its_last_seq() {
    let local = Local::start(Recording::echo(1, 2), config(Duration::from_secs(3600), 1)).await;
    local.submit("seq-1", "one", "hello there").await;
    let last = local.finished("seq-1").await.last_seq;
    assert_eq!(last, 5, "queued, start, two pieces, end");
    run_to_end(&local, "seq-2", "two").await;
    let (got, reads) = get_counting(&local, "seq-1").await;
    assert_eq!(reads, 1, "seq-1 left the table");
    assert_eq!(got.last_seq, last, "Get");
    let waited = local
        .coordinator
        .wait("seq-1", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(waited.snapshot.unwrap().last_seq, last, "Wait");
    // A retry answered by the record, then one answered from memory.
    for answered in ["by the record", "from memory"] {
        let retry = local.submit("seq-1", "one", "hello there").await;
        assert_eq!(retry.admission, Admission::Completed, "{answered}");
        assert_eq!(retry.snapshot.last_seq, last, "a retry answered {answered}");
    }
    let waited = local
        .coordinator
        .wait("seq-1", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        waited.snapshot.unwrap().last_seq,
        last,
        "Wait, back in memory"
    );
}

#[tokio::test(start_paused = true)]
async fn unfinished_runs_never_leave_the_dedupe_table_however_small() {
    let echo = Recording::echo(1, 2);
    let runtime = Holding::over(echo.clone());
    let release = runtime.release.clone();
    // No finished run may stay, not for an instant.
    let local = Local::start(runtime, config(Duration::ZERO, 0)).await;
    let hold = serde_json::json!({"hold": true});
    local
        .submit_with("running", "busy", "held open", hold)
        .await;
    local
        .until("running", "streaming", |s| s.outcome.text == "partial")
        .await;
    let queued = local.submit("queued", "busy", "behind it").await;
    assert_eq!(queued.snapshot.queue_position, 1);
    // Runs of other sessions finish meanwhile: each end sweeps the table
    // and takes the run that just finished with it.
    for i in 1..=3 {
        run_to_end(&local, &format!("done-{i}"), &format!("other-{i}")).await;
        let (snapshot, reads) = get_counting(&local, &format!("done-{i}")).await;
        assert_eq!(snapshot.status, RunStatus::Ok);
        assert_eq!(reads, 1, "done-{i} stayed in a table of capacity 0");
    }

    // The unfinished runs are where they were, answered from memory: the
    // live text, the queue position.
    let (running, reads) = get_counting(&local, "running").await;
    assert_eq!(reads, 0, "the running run left the table");
    assert_eq!(running.status, RunStatus::Running);
    assert_eq!(running.outcome.text, "partial");
    let (waiting, reads) = get_counting(&local, "queued").await;
    assert_eq!(reads, 0, "the queued run left the table");
    assert_eq!(waiting.status, RunStatus::Queued);
    assert_eq!(waiting.queue_position, 1);
    // Retries of their keys are in flight, decided in memory.
    let creates = local.served("create_run");
    let hold = serde_json::json!({"hold": true});
    let retry = local
        .submit_with("running", "busy", "held open", hold)
        .await;
    assert_eq!(retry.admission, Admission::InFlight);
    let retry = local.submit("queued", "busy", "behind it").await;
    assert_eq!(retry.admission, Admission::InFlight);
    assert_eq!(
        local.served("create_run"),
        creates,
        "a retry reached the store"
    );

    // The table still controls them: the queued one cancels without ever
    // executing, the running one finishes when released.
    let cancelled = local
        .coordinator
        .cancel(CancelTarget::Run("queued".into()))
        .await
        .unwrap();
    assert_eq!(cancelled[0].status, RunStatus::Aborted);
    release.cancel();
    let done = local.finished("running").await;
    assert_eq!(done.status, RunStatus::Ok);
    assert_eq!(done.outcome.text, "partial");
    assert_eq!(echo.count("queued"), 0, "the cancelled run executed");
    // Finished now, they leave the table like any other.
    for id in ["running", "queued"] {
        assert_eq!(get_counting(&local, id).await.1, 1, "{id} stayed");
    }
}

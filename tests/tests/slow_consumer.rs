//! A slow consumer costs the edge a bounded amount of memory, measured as
//! the edge process's peak RSS (`VmHWM` in `/proc/<pid>/status`), not as a
//! counter the edge keeps itself: clients that never read sit on a real
//! `gateway-edge` process while runs push far more events at them than
//! their send budget (`EDGE_MAX_BUFFERED_BYTES`) holds; a client that reads
//! gets every run to its end meanwhile.

use clawgate_system_tests::{Client, Role, System};
use serde_json::json;
use std::time::Duration;

/// Clients that never read.
const STUCK: u64 = 4;
/// Their send budget.
const BUDGET_KIB: u64 = 4 * 1024;
/// Runs, each echoing a message of this size.
const RUNS: usize = 32;
const MESSAGE_BYTES: usize = 256 * 1024;
/// What the edge may need besides the stuck clients' budgets: buffers,
/// the reader's share, allocator slack (measured here: about +12 MiB in
/// all).
const SLACK_KIB: u64 = 8 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_cost_a_bounded_share_of_edge_memory() {
    let cluster = System::builder()
        .env_for(
            Role::Edge,
            "EDGE_MAX_BUFFERED_BYTES",
            (BUDGET_KIB * 1024).to_string(),
        )
        .echo(4, Duration::ZERO)
        .start()
        .await;
    let url = cluster.edge_url(0);
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        // Connected, then never polled again: nothing is read from here on.
        stuck.push(Client::connect(&url, &["operator.read"]).await);
    }
    let mut reader = cluster.connect().await;
    let peak_before = cluster
        .edge()
        .status_kib("VmHWM")
        .expect("the edge's VmHWM");

    let message = "m".repeat(MESSAGE_BYTES);
    for n in 0..RUNS {
        let key = format!("flood-{n}");
        let sent = reader
            .request(
                "chat.send",
                json!({ "sessionKey": "flood", "message": message, "idempotencyKey": key }),
            )
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
        let end = reader.chat_end(&key).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
    }
    let peak_after = cluster
        .edge()
        .status_kib("VmHWM")
        .expect("the edge's VmHWM");
    // What went to every connection: the events the reader got.
    let pushed_kib: u64 = reader
        .events()
        .map(|event| event.to_string().len() as u64)
        .sum::<u64>()
        / 1024;
    let grew = peak_after.saturating_sub(peak_before);
    let allowed = STUCK * BUDGET_KIB + SLACK_KIB;
    eprintln!(
        "edge peak RSS {peak_before} → {peak_after} KiB (+{grew}); {pushed_kib} KiB of events \
         to each of {STUCK} stuck clients; allowed +{allowed}"
    );
    // The measurement means something only if, unbounded, the stuck
    // clients' queues would have grown far past what is allowed. They
    // share each event's payload, so unbounded they would hold what was
    // pushed once, plus a frame each (with a budget of 1 GiB instead, this
    // test measures +55 MiB and fails).
    assert!(
        pushed_kib >= allowed,
        "too few events to tell: {pushed_kib} KiB"
    );
    assert!(
        grew <= allowed,
        "the edge's peak RSS grew {grew} KiB with {STUCK} stuck clients (allowed {allowed})\n{}",
        cluster.output()
    );
    drop(stuck);
}

//! Balanced placement in process, on one memory store: coordinators spread
//! the partitions between them by rendezvous hashing over the member
//! registry; a joiner gets its share by graceful handoffs (executing runs
//! finish where they are, queued runs move and run once, in their lane's
//! order), and a leaver's partitions go back to the others.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{DEADLINE, Recording, counts, request, wait_for, wait_until};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::ownership::{OwnershipConfig, OwnershipMode, Placement};
use run_coordinator_api::model::{RunStatus, SubmitRequest};
use session_store::SessionStore;
use session_store::backend::memory::MemoryStore;

const PARTITIONS: u32 = 16;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        ownership: OwnershipConfig {
            mode: OwnershipMode::Lease,
            placement: Placement::Balanced,
            advertise_address: "http://test".into(),
            lease_ttl: Duration::from_millis(600),
            renew_interval: Duration::from_millis(100),
            handoff_timeout: Duration::from_secs(20),
            max_moves: 4,
        },
        ..CoordinatorConfig::default()
    }
}

fn held(coordinator: &Coordinator) -> HashSet<u32> {
    coordinator
        .ownership()
        .held()
        .into_iter()
        .filter(|(_, draining)| !draining)
        .map(|(p, _)| p)
        .collect()
}

/// Whether `coordinators` hold every partition between them, each once.
fn split_exactly(coordinators: &[&Coordinator]) -> bool {
    let sets: Vec<HashSet<u32>> = coordinators.iter().map(|c| held(c)).collect();
    let total: usize = sets.iter().map(HashSet::len).sum();
    let union: HashSet<u32> = sets.iter().flatten().copied().collect();
    total == PARTITIONS as usize && union.len() == PARTITIONS as usize
}

async fn status(store: &dyn SessionStore, run_id: &str) -> Option<RunStatus> {
    store.get_run(run_id).await.unwrap().map(|r| r.status)
}

/// Submits to whichever coordinator serves the session's partition now.
async fn submit(coordinators: &[&Coordinator], req: SubmitRequest) {
    let what = format!("a coordinator to admit {}", req.run_id);
    wait_for(what, DEADLINE, async || {
        for coordinator in coordinators {
            if coordinator.submit(req.clone()).await.is_ok() {
                return true;
            }
        }
        false
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_takes_its_share_by_handoff_and_a_leaver_gives_it_back() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::with_partitions(PARTITIONS));
    let first_runtime = Recording::echo(40, 5);
    let first = Coordinator::start(store.clone(), first_runtime.clone(), config())
        .await
        .unwrap();
    wait_until("the first member holds every partition", DEADLINE, || {
        held(&first).len() == PARTITIONS as usize && first.ownership().is_serving()
    })
    .await;
    // Two runs per session: one executing, one queued behind it, when the
    // second member joins.
    let sessions: Vec<String> = (0..24).map(|i| format!("agent:main:s{i}")).collect();
    for (i, session) in sessions.iter().enumerate() {
        for turn in 0..2 {
            submit(&[&first], request(&format!("r{i}-{turn}"), session)).await;
        }
    }
    let second_runtime = Recording::echo(40, 5);
    let second = Coordinator::start(store.clone(), second_runtime.clone(), config())
        .await
        .unwrap();
    wait_until("the partitions are split between the two", DEADLINE, || {
        split_exactly(&[&first, &second]) && !held(&second).is_empty() && !held(&first).is_empty()
    })
    .await;
    // Runs submitted now go to their partition's new owner.
    for (i, session) in sessions.iter().enumerate() {
        submit(&[&first, &second], request(&format!("r{i}-2"), session)).await;
    }
    let all: Vec<String> = (0..sessions.len())
        .flat_map(|i| (0..3).map(move |turn| format!("r{i}-{turn}")))
        .collect();
    for run_id in &all {
        wait_for(
            format!("{run_id} to end ok"),
            DEADLINE,
            async || match status(store.as_ref(), run_id).await {
                Some(RunStatus::Ok) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    }
    // Each ran once, on one of the two; the joiner ran some.
    let mut executions = first_runtime.executions();
    executions.extend(second_runtime.executions());
    let ran = counts(&executions);
    for run_id in &all {
        assert_eq!(
            ran.get(run_id),
            Some(&1),
            "{run_id} ran {:?} times",
            ran.get(run_id)
        );
    }
    // Runs queued on the first when its partitions moved ran on the joiner.
    let moved: Vec<String> = second_runtime
        .executions()
        .into_iter()
        .map(|e| e.run_id)
        .filter(|id| id.ends_with("-1"))
        .collect();
    assert!(!moved.is_empty(), "no queued run moved to the joiner");
    // Each session's turns ran in order, never two at once.
    for i in 0..sessions.len() {
        let runs: Vec<_> = (0..3)
            .map(|turn| {
                let id = format!("r{i}-{turn}");
                executions.iter().find(|e| e.run_id == id).unwrap().clone()
            })
            .collect();
        for pair in runs.windows(2) {
            assert!(
                pair[0].ended.unwrap() <= pair[1].started,
                "{} started before {} ended",
                pair[1].run_id,
                pair[0].run_id
            );
        }
    }
    // The joiner leaves (a planned stop): the first takes everything back.
    second.hand_over(Duration::from_secs(5)).await;
    wait_until(
        "the first member holds every partition again",
        DEADLINE,
        || held(&first).len() == PARTITIONS as usize,
    )
    .await;
    submit(&[&first], request("after-leave", "agent:main:s0")).await;
}

//! A coordinator that lost its tenure is gone within twice its lease TTL
//! and exits non-zero, whatever the store, the network or its own open
//! calls do, so that its pod is restarted and rejoins.
//!
//! Real processes: a PostgreSQL store, three balanced lease coordinators
//! (leases of 4 s) executing runs of 3 s through a gRPC runtime, one edge,
//! every store link through a fault proxy. Sixty runs execute; then two
//! coordinators are SIGSTOPped for twice the TTL, so that their leases
//! lapse and the third takes their partitions:
//! - one has open calls of its own on it: a `Subscribe(all)` whose events
//!   the test never reads, and a `Wait` for each run with a 10-minute
//!   timeout;
//! - the other's store link is silent (a blackhole) from before the pause
//!   until after its exit, so the store's verdict never reaches it.
//!
//! Both get SIGCONT at once. Each must exit non-zero within 2 × TTL of it
//! (a bound with a quarter TTL to spare: the stop's deadlines end the
//! process at 7/4 TTL after the loss, `run-coordinator/src/stop.rs`). Then
//! the survivor serves every partition and every run ends, each executed
//! once.

use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::process::logged_at_ms;
use clawgate_system_tests::records::{
    is_terminal, lease_table, live_leases_by_address, run_record,
};
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::sandbox::Backend;
use clawgate_system_tests::system::{CoordinatorSpec, Runtime, System};
use clawgate_system_tests::{Client, report, wait_for};
use serde_json::json;
use tokio::time::Instant;
use tonic::transport::Channel;

const TTL: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_millis(800);
const PARTITIONS: u32 = 32;
const RUNS: usize = 60;
/// Bounds on a broken system, not measurements.
const DEADLINE: Duration = Duration::from_secs(120);

fn run_id(n: usize) -> String {
    format!("self-stop-{n}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_lost_its_leases_exits_within_twice_the_ttl() {
    let runtime = CountingRuntime::start(Duration::from_secs(3)).await;
    let spec = CoordinatorSpec::lease(Runtime::Grpc(runtime.url()), Duration::from_secs(2))
        .lease_times(TTL, RENEW)
        .args(&["--placement", "balanced", "--max-executing", "32"]);
    let mut system = System::builder()
        .backend(Backend::Postgres)
        .store_args(&["--partitions", &PARTITIONS.to_string()])
        .coordinator(spec)
        .coordinators(3)
        .edges(1)
        .fault_links()
        .start()
        .await;
    let mut store = SessionStoreClient::connect(system.store_url())
        .await
        .unwrap();
    wait_for("the partitions spread over three", DEADLINE, async || {
        let owners = owners(&mut store).await;
        (owners.len() == 3)
            .then_some(())
            .ok_or(format!("{owners:?}"))
    })
    .await;

    let mut client = Client::connect(&system.edge_url(0), OPERATOR_SCOPES).await;
    for n in 0..RUNS {
        let params = json!({"sessionKey": format!("self-stop-{n}"), "message": "hi",
                            "idempotencyKey": run_id(n)});
        let res = client.request("chat.send", params).await;
        assert_eq!(res["ok"], true, "{res}");
    }
    let (with_calls, silenced) = (1, 2);
    let executing = executing_on(&mut store, &system.coordinators[with_calls].url()).await;
    assert!(
        executing > 0,
        "the coordinator with open calls executes nothing: the test would prove nothing"
    );

    // Open calls on the first: a subscription never read, and waits.
    let mut direct = RunCoordinatorClient::connect(system.coordinators[with_calls].url())
        .await
        .unwrap();
    let subscribe = pb::SubscribeRequest {
        filter: Some(pb::subscribe_request::Filter::All(true)),
        ..Default::default()
    };
    let _unread = direct.subscribe(subscribe).await.unwrap();
    let waits: Vec<_> = (0..RUNS)
        .map(|n| {
            let mut direct = direct.clone();
            tokio::spawn(async move {
                let wait = pb::WaitRequest {
                    run_id: run_id(n),
                    timeout_ms: 600_000,
                };
                direct.wait(wait).await
            })
        })
        .collect();

    system.coordinators[silenced].store_link().silence();
    for n in [with_calls, silenced] {
        system.coordinators[n].process.signal("STOP");
    }
    tokio::time::sleep(2 * TTL).await;
    for n in [with_calls, silenced] {
        system.coordinators[n].process.signal("CONT");
    }
    let resumed = Instant::now();
    let mut took = [None, None];
    wait_until_both_exit(&mut system, [with_calls, silenced], &mut took).await;
    for (n, took) in [with_calls, silenced].into_iter().zip(took) {
        let took = took.expect("seen exiting") - resumed;
        let coordinator = &mut system.coordinators[n];
        let status = coordinator.process.wait_exit(DEADLINE).await;
        let output = coordinator.process.output_text();
        report(&format!(
            "coordinator {n} exited {took:?} after SIGCONT ({status}), TTL {TTL:?}"
        ));
        assert!(!status.success(), "coordinator {n} exited 0:\n{output}");
        assert!(
            took <= 2 * TTL,
            "coordinator {n} exited {took:?} after SIGCONT, more than 2 × TTL:\n{output}"
        );
    }
    for wait in waits {
        wait.abort();
    }
    system.coordinators[silenced].store_link().heal();

    // The survivor serves everything; every run ends, each executed once.
    let survivor = system.coordinators[0].url();
    wait_for(
        "the survivor to hold every partition",
        DEADLINE,
        async || {
            let owners = owners(&mut store).await;
            let only = owners.len() == 1 && owners.contains_key(&survivor);
            only.then_some(()).ok_or(format!("{owners:?}"))
        },
    )
    .await;
    for n in 0..RUNS {
        let run = run_id(n);
        wait_for(format!("{run} to end"), DEADLINE, async || {
            let record = run_record(&mut store, &run).await;
            match record {
                Some(record) if is_terminal(record.status()) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    let twice: Vec<_> = runtime
        .executions()
        .into_iter()
        .filter(|(_, count)| *count > 1)
        .collect();
    assert!(twice.is_empty(), "runs executed twice: {twice:?}");
    system.finish().await;
}

/// Live leases by the owner's advertised address.
async fn owners(
    store: &mut SessionStoreClient<Channel>,
) -> std::collections::HashMap<String, usize> {
    live_leases_by_address(&lease_table(store).await)
}

/// How many runs the coordinator advertised at `address` executes now.
async fn executing_on(store: &mut SessionStoreClient<Channel>, address: &str) -> usize {
    let table = lease_table(store).await;
    let member = table
        .leases
        .iter()
        .find(|l| l.address == address)
        .and_then(|l| l.owner.clone())
        .expect("the coordinator holds a lease");
    let active = store
        .list_active_runs(store_pb::ListActiveRunsRequest {
            owner: Some(member),
        })
        .await
        .unwrap()
        .into_inner()
        .runs;
    active
        .iter()
        .filter(|r| r.status == store_pb::RunStatus::Running as i32)
        .count()
}

/// Waits until both coordinators have exited, noting when each was first
/// seen gone.
async fn wait_until_both_exit(
    system: &mut System,
    which: [usize; 2],
    took: &mut [Option<Instant>; 2],
) {
    let waited = clawgate_system_tests::wait::poll("both to exit", DEADLINE, async || {
        for (slot, n) in which.into_iter().enumerate() {
            if took[slot].is_none() && system.coordinators[n].process.exited() {
                took[slot] = Some(Instant::now());
            }
        }
        took.iter().all(Option::is_some)
    })
    .await;
    if let Err(timed_out) = waited {
        panic!("{timed_out}:\n{}", system.output());
    }
}

/// A leader whose store stops answering (its link silent: no refusal, no
/// reset) fences itself by its own clock: it stops serving before its
/// lease can expire on the store's clock, so that it never acts while
/// another could hold its partitions. The standby takes over only after
/// the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_store_goes_silent_stops_before_its_lease_expires() {
    // The fence comes a renew interval before the expiry: 1.5 s of margin.
    let renew = Duration::from_millis(1_500);
    let spec = CoordinatorSpec::lease(
        Runtime::Echo {
            chunks: 4,
            pace: Duration::from_millis(20),
        },
        Duration::from_secs(2),
    )
    .lease_times(TTL, renew);
    let system = System::builder()
        .coordinator(spec)
        .coordinators(2)
        .edges(0)
        .fault_links()
        .start()
        .await;
    let mut store = SessionStoreClient::connect(system.store_url())
        .await
        .unwrap();
    let leader = wait_for("a leader", DEADLINE, async || system.leader().await).await;
    let standby = 1 - leader;
    let address = system.coordinators[leader].url();

    system.coordinators[leader].store_link().silence();
    // Renewals sent from now on are held: the expiry the store has stays.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let expiry = lease_expiry(&mut store, &address).await;
    wait_for("the leader to stop serving", DEADLINE, async || {
        (!system.coordinators[leader].serving().await).then_some(())
    })
    .await;
    // When it stopped, by its own log (the fence flips serving off as it
    // logs): a poll's lag on a loaded machine is no part of the claim.
    let output = system.coordinators[leader].process.output_text();
    let fenced = logged_at_ms(&output, "ownership lost; this coordinator stops")
        .unwrap_or_else(|| panic!("the leader logged no loss:\n{output}"));
    report(&format!(
        "the silent leader stopped serving {} ms before its lease expired on the store's clock",
        expiry - fenced
    ));
    assert!(
        fenced < expiry,
        "the leader stopped at {fenced} (its log, ms), not before its lease expired at {expiry} (the store's clock)"
    );
    // It acts no more: a Submit straight to it is refused.
    let mut direct = RunCoordinatorClient::connect(system.coordinators[leader].process.url())
        .await
        .unwrap();
    let refused = direct
        .submit(pb::SubmitRequest {
            run_id: "after-the-fence".into(),
            session_key: "main".into(),
            kind: "chat".into(),
            message: "hello".into(),
            ..Default::default()
        })
        .await
        .expect_err("a fenced leader admits nothing");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // The standby takes over once the lease expired, not before.
    system.coordinators[standby]
        .until_serving(Instant::now(), DEADLINE)
        .await;
    let took_at = store_now(&mut store).await;
    assert!(
        took_at >= expiry,
        "the standby served at {took_at}, before {expiry}"
    );
    system.coordinators[leader].store_link().heal();
    system.finish().await;
}

/// The expiry (store clock, ms) of the leases the coordinator at `address`
/// holds.
async fn lease_expiry(store: &mut SessionStoreClient<Channel>, address: &str) -> i64 {
    lease_table(store)
        .await
        .leases
        .iter()
        .filter(|l| l.address == address && l.owner.is_some())
        .map(|l| l.expires_at_ms)
        .max()
        .expect("the leader holds leases")
}

/// The store's clock now, ms.
async fn store_now(store: &mut SessionStoreClient<Channel>) -> i64 {
    lease_table(store).await.now_ms
}

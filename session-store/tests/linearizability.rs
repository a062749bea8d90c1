//! Issue 14: the writer fence is linearizable. Several clients issue random
//! acquires, takeovers, appends, releases, resets, deletes, reads, run
//! starts and finishes and lease takes, renewals and releases at once,
//! through the gRPC server and `RemoteStore`, on each backend; every call
//! and answer is recorded with a global logical clock, and the history is
//! checked against the sequential model (`lincheck/model/`) with a
//! Wing–Gong checker (`lincheck/mod.rs`). Afterwards every transcript must
//! hold the entries of the appends that were acknowledged, and nothing else
//! but entries of writes that never answered. Leases last 25 ms,
//! so takes decided by expiry are in every history.
//!
//! Issue 32: the same with faults, on the real binary: its process is
//! SIGKILLed and restarted on the same data, and SIGSTOPped until calls
//! time out, under the clients; calls without an answer are indeterminate
//! (`lincheck/history/faults.rs`). Last, one interleaving on PostgreSQL (a
//! lease release while a write of its tenure is in flight) is forced and
//! checked the same way.
//!
//! `LINCHECK_OPS` (operations per run, default 2000), `LINCHECK_SEED`
//! (decimal or 0x-hex), `LINCHECK_TASKS` (clients, default 8),
//! `LINCHECK_LEASE_TTL_MS` (default 25), `LINCHECK_KILLS` and
//! `LINCHECK_PAUSES` (faults per faulty run, default 3 and 2). The seed
//! fixes every client's choices; the interleaving is the scheduler's.

mod lincheck;
mod suite;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clawgate_system_tests::wait::wait_for;
use lincheck::Operation;
use lincheck::history::faults::StoreProcess;
use lincheck::history::run::{Store, lincheck};
use lincheck::history::{DEFAULT_LEASE_TTL_MS, Layout, SESSIONS_PER_PARTITION, global, perform};
use lincheck::model::{Input, Output, Partition, Token};
use session_store::SessionStore;
use suite::harness::{self, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_embedded() {
    lincheck("embedded", Store::InProcess(harness::embedded().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_postgres() {
    lincheck("postgres", Store::InProcess(harness::postgres().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_on_memory() {
    lincheck("memory", Store::InProcess(harness::memory().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_with_store_kills_and_pauses_on_embedded() {
    lincheck(
        "faults_on_embedded",
        Store::Process(StoreProcess::embedded()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_with_store_kills_and_pauses_on_postgres() {
    lincheck(
        "faults_on_postgres",
        Store::Process(StoreProcess::postgres()),
    )
    .await;
}

/// ReleaseLeases on PostgreSQL with a write of the released tenure in
/// flight, the interleaving the randomized run above found, forced: the
/// write has passed its owner check and waits for its session row (held by
/// another connection, as a concurrent write would); the release is called;
/// once it has answered (or, if it waits for the write, once it does), the
/// session is read; then the row is let go. Whatever the store does, the
/// history must be linearizable: either the release waits for the write,
/// or the write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lease_release_is_ordered_after_the_writes_of_its_tenure() {
    use session_store::backend::postgres::{self, PgOptions, PostgresStore};

    let schema = format!("sstest_{}", uuid::Uuid::new_v4().simple());
    let url = harness::postgres_url();
    let options = PgOptions {
        schema: Some(schema.clone()),
        ..PgOptions::default()
    };
    let store = PostgresStore::connect(&url, options)
        .await
        .expect("connect to PostgreSQL (is it running? see README)");
    let server = TestServer::start(Arc::new(store), Default::default()).await;
    let remote: Arc<dyn SessionStore> = Arc::new(server.remote().await);
    let layout = Arc::new(Layout::new());
    let clock = Arc::new(AtomicU64::new(0));
    let tick = |clock: &AtomicU64| clock.fetch_add(1, Ordering::SeqCst);
    // Performs one operation on the first partition, recorded.
    let record = |input: Input| {
        let (remote, layout, clock) = (remote.clone(), layout.clone(), clock.clone());
        async move {
            let call = tick(&clock);
            let output = perform(&*remote, &layout, 0, &input, call, DEFAULT_LEASE_TTL_MS)
                .await
                .expect("a rule's answer");
            let ret = tick(&clock);
            Operation {
                client: call as usize,
                input,
                call,
                output,
                ret,
            }
        }
    };
    let mut history = Vec::new();

    let take = record(Input::TakeLease {
        member: 0,
        steal: false,
    })
    .await;
    let Output::Lease {
        granted: true,
        lease,
        ..
    } = take.output
    else {
        panic!("the lease was not granted: {take:?}")
    };
    let token = Token {
        member: 0,
        epoch: lease.epoch,
    };
    history.push(take);
    let acquire = record(Input::Acquire {
        s: 0,
        expect: None,
        expected_writer: None,
        run: 1,
        takeover: false,
        token: Some(token),
    })
    .await;
    let Output::Acquired(held) = &acquire.output else {
        panic!("the acquire failed: {acquire:?}")
    };
    let append = Input::Append {
        s: 0,
        sid: held.session.id,
        run: 1,
        fence: held.fence,
        count: 1,
        token: Some(token),
    };
    history.push(acquire);

    // Another connection holds the session row, as a write in progress would.
    let connect = || async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(connection);
        client
    };
    let blocker = connect().await;
    let monitor = connect().await;
    blocker
        .batch_execute(&format!("SET search_path TO \"{schema}\"; BEGIN"))
        .await
        .unwrap();
    let blocker_pid: i32 = blocker
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let key = layout.keys[global(0, 0)].as_str().to_owned();
    blocker
        .execute(
            "SELECT 1 FROM sessions WHERE session_key = $1 FOR UPDATE",
            &[&key],
        )
        .await
        .unwrap();
    let blocked_by = |pid: i32| {
        let monitor = &monitor;
        async move {
            monitor
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&pid],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get::<_, i32>(0))
                .collect::<Vec<i32>>()
        }
    };
    // A bound so that a store that blocks elsewhere fails the test instead
    // of hanging it; the outcome never depends on it.
    let give_up = Duration::from_secs(120);
    let appending = tokio::spawn(record(append));
    // The append has passed its owner check and waits for the row.
    let append_pid = wait_for("the append to wait for the row", give_up, async || {
        let pid = blocked_by(blocker_pid).await.first().copied();
        assert!(
            pid.is_some() || !appending.is_finished(),
            "the append did not wait for the row"
        );
        pid
    })
    .await;
    let releasing = tokio::spawn(record(Input::ReleaseLease { token }));
    // Either the release answers, or it waits for the append.
    let what = "the release to answer or to wait for the append";
    let release_waits = wait_for(what, give_up, async || {
        if releasing.is_finished() {
            return Some(false);
        }
        (!blocked_by(append_pid).await.is_empty()).then_some(true)
    })
    .await;
    if release_waits {
        blocker.batch_execute("COMMIT").await.unwrap();
        history.push(appending.await.unwrap());
        history.push(releasing.await.unwrap());
        history.push(record(Input::Read { s: 0 }).await);
    } else {
        history.push(releasing.await.unwrap());
        history.push(record(Input::Read { s: 0 }).await);
        blocker.batch_execute("COMMIT").await.unwrap();
        history.push(appending.await.unwrap());
    }
    drop((blocker, monitor, remote));
    server.stop().await;
    postgres::drop_schema(&url, &schema)
        .await
        .expect("drop test schema");

    let model = Partition {
        sessions: SESSIONS_PER_PARTITION,
        lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
    };
    let mut text = String::new();
    for op in &history {
        let _ = writeln!(
            text,
            "  [{}, {}] {:?}\n      => {:?}",
            op.call, op.ret, op.input, op.output
        );
    }
    if let Err(failure) = lincheck::check(&model, &history) {
        panic!(
            "ReleaseLeases answered (waited for the write in flight: {release_waits}) \
             while a write of its tenure was in flight, and that write then succeeded:\n{text}\n{}",
            lincheck::explain(&model, &history, &failure)
        );
    }
}

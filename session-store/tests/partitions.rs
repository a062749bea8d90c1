//! The partition count is fixed at a store's first start, on each durable
//! backend; and WatchLeases streams the lease table as it changes (and
//! now and then unchanged).

mod suite;

use std::sync::Arc;
use std::time::Duration;

use clawgate_system_tests::wait::wait_for;
use futures::StreamExt;
use session_store::SessionStore;
use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store::backend::memory::MemoryStore;
use session_store::backend::postgres::{self, PgOptions, PostgresStore};
use session_store::grpc::client::RemoteStore;
use session_store::model::{AcquireLeases, LeaseTable};
use suite::harness::{TestServer, postgres_url};

fn refused_for_its_count(err: session_store::StoreError) {
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(
        err.to_string()
            .contains("the partition count cannot change"),
        "{err}"
    );
}

#[tokio::test]
async fn an_embedded_store_keeps_its_first_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let options = |partitions| EmbeddedOptions {
        partitions,
        ..EmbeddedOptions::default()
    };
    // A dropped store closes its file when its writer thread has stopped:
    // reopening polls until then.
    let open = |partitions| {
        let path = path.clone();
        async move {
            wait_for("the file to be free", Duration::from_secs(30), async || {
                match EmbeddedStore::open(&path, options(partitions)).await {
                    Err(err) if err.code() == "UNAVAILABLE" => None,
                    opened => Some(opened),
                }
            })
            .await
        }
    };
    let store = open(64).await.unwrap();
    assert_eq!(store.list_leases().await.unwrap().partition_count, 64);
    drop(store);
    match open(256).await {
        Ok(_) => panic!("reopened with another partition count"),
        Err(err) => refused_for_its_count(err),
    }
    let again = open(64).await.unwrap();
    assert_eq!(again.list_leases().await.unwrap().leases.len(), 64);
}

#[tokio::test]
async fn a_postgres_store_keeps_its_first_partition_count() {
    let schema = format!("sstest_{}", uuid::Uuid::new_v4().simple());
    let options = |partitions| PgOptions {
        schema: Some(schema.clone()),
        partitions,
        ..PgOptions::default()
    };
    let store = PostgresStore::connect(&postgres_url(), options(16))
        .await
        .unwrap();
    assert_eq!(store.list_leases().await.unwrap().leases.len(), 16);
    drop(store);
    let reopened = PostgresStore::connect(&postgres_url(), options(32)).await;
    postgres::drop_schema(&postgres_url(), &schema)
        .await
        .unwrap();
    match reopened {
        Ok(_) => panic!("reopened with another partition count"),
        Err(err) => refused_for_its_count(err),
    }
}

/// A memory store of `partitions` served on port 0, a client of it, and a
/// 100 ms watch of its leases whose first table has been read.
async fn watching(
    partitions: u32,
) -> (
    TestServer,
    RemoteStore,
    impl futures::Stream<Item = session_store::StoreResult<LeaseTable>> + Unpin,
    LeaseTable,
) {
    let server = TestServer::start(
        Arc::new(MemoryStore::with_partitions(partitions)),
        Default::default(),
    )
    .await;
    let store = RemoteStore::connect(&server.url()).await.unwrap();
    let mut watch = Box::pin(store.watch_leases(100).await.unwrap());
    let first = watch.next().await.unwrap().unwrap();
    (server, store, watch, first)
}

/// The watch's next table, within a deadline.
async fn next_table(
    watch: &mut (impl futures::Stream<Item = session_store::StoreResult<LeaseTable>> + Unpin),
    what: &str,
) -> LeaseTable {
    tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect(what)
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_leases_sends_the_table_then_each_change() {
    let (server, store, mut watch, first) = watching(4).await;
    assert_eq!(first.partition_count, 4);
    assert!(first.leases.iter().all(|l| l.owner.is_none()));
    store
        .acquire_leases(AcquireLeases {
            member: "a".into(),
            address: "http://a".into(),
            partitions: vec![2],
            ttl_ms: 60_000,
            steal: false,
        })
        .await
        .unwrap();
    let changed = next_table(&mut watch, "a change is sent").await;
    assert_eq!(changed.leases[2].owner.as_deref(), Some("a"));
    assert_eq!(changed.leases[2].epoch, 1);
    // A watch still open does not hold up the server's shutdown.
    server.stop().await;
    drop(watch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_leases_sends_an_unchanged_table_now_and_then() {
    let (server, _store, mut watch, first) = watching(2).await;
    // Nothing changes; the table comes again, so that the watcher can tell
    // a quiet table from a silent stream.
    let again = next_table(&mut watch, "the table is sent again").await;
    assert_eq!(again.leases, first.leases);
    server.stop().await;
    drop(watch);
}

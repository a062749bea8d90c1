//! The PostgreSQL backend against a real server (127.0.0.1:5432 unless
//! CLAWGATE_TEST_POSTGRES_URL says otherwise), each test in a schema of its own.

use std::sync::Arc;

use super::*;

/// Awaits `$call` and asserts that it failed with `$pattern`.
macro_rules! assert_fails {
    ($call:expr, $pattern:pat) => {{
        let err = $call.await.unwrap_err();
        assert!(matches!(err, $pattern), "{err:?}");
    }};
}

/// The tests' PostgreSQL (the test kit's one definition of it).
fn url() -> String {
    clawgate_system_tests::postgres_url()
}

async fn open(schema: &str) -> PostgresStore {
    let schema = Some(schema.to_owned());
    let options = PgOptions {
        schema,
        pool_size: 4,
        ..PgOptions::default()
    };
    PostgresStore::connect(&url(), options).await.unwrap()
}

/// Runs `body` with a fresh schema name; drops the schema afterwards,
/// also when `body` panics.
async fn with_schema<F: Future<Output = ()> + Send + 'static>(body: impl FnOnce(String) -> F) {
    let schema = format!("sstest_pg_{}", Uuid::new_v4().simple());
    let outcome = tokio::spawn(body(schema.clone())).await;
    drop_schema(&url(), &schema).await.unwrap();
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

fn key(raw: &str) -> SessionKey {
    SessionKey::parse(raw).unwrap()
}

fn acquire(k: &SessionKey, run_id: &str, expected: Option<&str>) -> AcquireWriter {
    AcquireWriter {
        owner_token: None,
        key: k.clone(),
        expected_session: ExpectedSession::Current,
        expected_writer: expected.map(str::to_owned),
        run_id: run_id.to_owned(),
        mode: AcquireMode::Cas,
        label: Some(format!("Label of {run_id}")),
    }
}

fn append(held: &Acquired, contents: &[&str]) -> AppendEntries {
    let entry = |content: &&str| NewEntry {
        role: "assistant".to_owned(),
        content_json: (*content).to_owned(),
        timestamp_ms: Some(42),
        metadata: EntryMetadata {
            stop_reason: Some("end_turn".to_owned()),
            usage_json: None,
            aborted: true,
        },
    };
    AppendEntries {
        owner_token: None,
        key: held.session.key.clone(),
        session_id: held.session.session_id,
        run_id: held.session.active_writer_run_id.clone().unwrap(),
        fence_token: held.fence_token,
        entries: contents.iter().map(entry).collect(),
    }
}

fn history(k: &SessionKey, cursor: HistoryCursor, max_chars: Option<u32>) -> HistoryQuery {
    let (key, limit, session_id) = (k.clone(), 2, None);
    HistoryQuery {
        key,
        limit,
        cursor,
        max_chars,
        session_id,
    }
}

async fn stored_entries(store: &PostgresStore, id: SessionId) -> i64 {
    let sql = "SELECT count(*) FROM transcript_entries WHERE session_id = $1::text::uuid";
    let client = store.client().await.unwrap();
    client
        .query_one(sql, &[&id.to_string()])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn fence_append_history_reset_delete() {
    with_schema(|schema| async move {
        let store = open(&schema).await;
        let k = key("thread:1");
        let a = store.acquire_writer(acquire(&k, "a", None)).await.unwrap();
        assert_eq!((a.fence_token, a.session_created), (1, true));
        assert_fails!(
            store.acquire_writer(acquire(&k, "b", None)),
            StoreError::WriterConflict { .. }
        );
        let b = store
            .acquire_writer(acquire(&k, "b", Some("a")))
            .await
            .unwrap();
        assert_eq!(
            (b.fence_token, b.superseded_run_id.as_deref()),
            (2, Some("a"))
        );
        assert_fails!(
            store.append(append(&a, &["x"])),
            StoreError::StaleWriter { .. }
        );

        let done = store.append(append(&b, &["1", "22", "333"])).await.unwrap();
        assert_eq!(
            (done.first_seq, done.last_seq, done.session.entry_count),
            (1, 3, 3)
        );
        let page = store
            .history(history(&k, HistoryCursor::Latest, None))
            .await
            .unwrap();
        let seqs: Vec<u64> = page.entries.iter().map(|e| e.seq).collect();
        assert_eq!((seqs, page.has_more, page.total), (vec![2, 3], true, 3));
        let e = &page.entries[1];
        assert_eq!(
            (e.content_json.as_str(), e.timestamp_ms, e.run_id.as_str()),
            ("333", 42, "b")
        );
        assert_eq!(e.metadata.stop_reason.as_deref(), Some("end_turn"));
        assert!(e.metadata.aborted);
        let page = store
            .history(history(&k, HistoryCursor::After(1), Some(3)))
            .await
            .unwrap();
        assert_eq!((page.entries.len(), page.has_more), (1, true));
        // Text PostgreSQL cannot hold is the caller's error.
        assert_fails!(
            store.append(append(&b, &["nul\0"])),
            StoreError::InvalidArgument(_)
        );

        let reset = store.reset_session(&k).await.unwrap();
        assert_eq!(reset.previous_session_id, Some(b.session.session_id));
        assert_eq!(reset.superseded_run_id.as_deref(), Some("b"));
        assert_eq!(reset.session.label.as_deref(), Some("Label of a"));
        assert_fails!(
            store.append(append(&b, &["x"])),
            StoreError::SessionReplaced { .. }
        );
        let mut old = history(&k, HistoryCursor::Before(3), None);
        old.session_id = Some(b.session.session_id);
        let page = store.history(old).await.unwrap();
        assert_eq!(
            (page.entries[0].seq, page.total, page.has_more),
            (1, 3, false)
        );

        let c = store.acquire_writer(acquire(&k, "c", None)).await.unwrap();
        assert_eq!(c.fence_token, 3);
        store.append(append(&c, &["x"])).await.unwrap();
        let gone = store.delete_session(&k, true).await.unwrap();
        assert_eq!(
            (gone.deleted, gone.superseded_run_id.as_deref()),
            (true, Some("c"))
        );
        assert_eq!(stored_entries(&store, c.session.session_id).await, 0);
        assert_eq!(stored_entries(&store, b.session.session_id).await, 3);
        assert!(store.get_session(&k).await.unwrap().is_none());
        let page = store
            .history(history(&k, HistoryCursor::Latest, None))
            .await
            .unwrap();
        assert!(page.session_id.is_none());
        assert!(!store.delete_session(&k, true).await.unwrap().deleted);
        let released = store.release_writer(&k, "c", 3, None).await.unwrap();
        assert!(!released.released && released.session.is_none());

        // The fence counter survives the delete and a reconnect.
        let store = open(&schema).await;
        let d = store.acquire_writer(acquire(&k, "d", None)).await.unwrap();
        assert_eq!((d.fence_token, d.session_created), (4, true));
        let released = store.release_writer(&k, "d", 4, None).await.unwrap();
        assert!(released.released);
        assert_eq!(released.session.unwrap().active_writer_run_id, None);
    })
    .await;
}

#[tokio::test]
async fn runs_create_update_purge() {
    with_schema(|schema| async move {
        let store = open(&schema).await;
        let k = key("runs");
        let new = |run_id: &str, fingerprint: &str| NewRun {
            owner_token: None,
            run_id: run_id.to_owned(),
            session_key: k.clone(),
            kind: "agent".to_owned(),
            fingerprint: fingerprint.to_owned(),
            status: RunStatus::Accepted,
            owner: "owner-1".to_owned(),
            request_json: "{}".to_owned(),
            expected_settings: None,
            create_session: false,
        };
        let created = store.create_run(new("r1", "f")).await.unwrap();
        assert!(created.created);
        let again = store.create_run(new("r1", "other")).await.unwrap();
        assert!(!again.created && again.fingerprint_mismatch);
        assert_eq!(again.record, created.record);
        store.create_run(new("r2", "f")).await.unwrap();

        store.acquire_writer(acquire(&k, "r1", None)).await.unwrap();
        let update = |version, status| RunUpdate {
            owner_token: None,
            run_id: "r1".to_owned(),
            expected_version: version,
            status,
            owner: Some("owner-2".to_owned()),
            outcome_json: Some("{}".to_owned()),
            session_id: Some(Uuid::new_v4()),
            fence_token: Some(u64::MAX),
        };
        let stale = update(7, RunStatus::Running);
        assert_fails!(
            store.update_run(stale),
            StoreError::RunVersionConflict { .. }
        );
        let running = store
            .update_run(update(1, RunStatus::Running))
            .await
            .unwrap();
        assert_eq!((running.version, running.fence_token), (2, Some(u64::MAX)));
        assert!(running.started_at_ms.is_some());
        assert_eq!(store.get_run("r1").await.unwrap().as_ref(), Some(&running));
        let active = store.list_active_runs(Some("owner-2")).await.unwrap();
        assert_eq!(active, vec![running]);
        assert_eq!(store.list_active_runs(None).await.unwrap().len(), 2);

        let done = store.update_run(update(2, RunStatus::Ok)).await.unwrap();
        let session = store.get_session(&k).await.unwrap().unwrap();
        assert_eq!(session.last_run_status, Some(RunStatus::Ok));
        assert_fails!(
            store.update_run(update(3, RunStatus::Error)),
            StoreError::RunTerminal { .. }
        );
        let unknown = RunUpdate {
            owner_token: None,
            run_id: "nope".into(),
            ..update(1, RunStatus::Ok)
        };
        assert_fails!(store.update_run(unknown), StoreError::RunNotFound(_));

        let ended = done.ended_at_ms.unwrap();
        assert_eq!(store.purge_expired_runs(ended).await.unwrap(), 0);
        assert_eq!(store.purge_expired_runs(ended + 1).await.unwrap(), 1);
        assert_eq!(store.get_run("r1").await.unwrap(), None);
        assert!(store.get_run("r2").await.unwrap().is_some());
    })
    .await;
}

#[tokio::test]
async fn list_sessions_walks_batches() {
    with_schema(|schema| async move {
        let store = open(&schema).await;
        // More rows than one batch, the matches among the oldest. Each
        // in a millisecond of its own, so that the newest-first order
        // the test expects is not left to ties (broken by key).
        let mut last_ms = 0;
        for i in 0..LIST_BATCH + 20 {
            while clawgate_common::clock::now_ms() == last_ms {
                tokio::task::yield_now().await;
            }
            let mut req = acquire(&key(&format!("k{i:03}")), "r", None);
            req.label = (i < 5).then(|| format!("Needle {i}"));
            store.acquire_writer(req).await.unwrap();
            last_ms = clawgate_common::clock::now_ms();
        }
        let list = |limit, search: Option<&str>, updated_since_ms| {
            let search = search.map(str::to_owned);
            store.list_sessions(ListQuery {
                limit,
                updated_since_ms,
                search,
            })
        };
        let found = list(3, Some("nEEDLE"), None).await.unwrap();
        let keys: Vec<&str> = found.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            ["agent:main:k004", "agent:main:k003", "agent:main:k002"]
        );
        let all = list(1000, None, None).await.unwrap();
        assert_eq!(all.len(), LIST_BATCH + 20);
        let order = |s: &Session| (std::cmp::Reverse(s.updated_at_ms), s.key.clone());
        assert!(all.windows(2).all(|w| order(&w[0]) < order(&w[1])));
        let newest = all[0].updated_at_ms;
        let recent = list(1000, None, Some(newest)).await.unwrap();
        assert!(!recent.is_empty() && recent.iter().all(|s| s.updated_at_ms == newest));
        assert!(list(0, None, None).await.unwrap().is_empty());
    })
    .await;
}

/// Replicas on one database: they migrate at the same time, exactly one
/// of concurrent CAS acquires wins, and concurrent appends get disjoint
/// seqs without gaps.
#[tokio::test]
async fn replicas_race() {
    with_schema(|schema| async move {
        let opening = futures::future::join_all((0..4).map(|_| open(&schema))).await;
        let replicas: Vec<Arc<PostgresStore>> = opening.into_iter().map(Arc::new).collect();
        let replica = |i: usize| replicas[i % replicas.len()].clone();
        let k = key("contended");
        let attempts = (0..16).map(|i| {
            let (store, req) = (replica(i), acquire(&k, &format!("run-{i}"), None));
            tokio::spawn(async move { store.acquire_writer(req).await })
        });
        let results = futures::future::join_all(attempts).await;
        let mut winners = results.into_iter().filter_map(|r| r.unwrap().ok());
        let winner = winners.next().unwrap();
        assert!(winners.next().is_none());
        let appends = (0..16).map(|i| {
            let (store, req) = (replica(i), append(&winner, &["x", "y"]));
            tokio::spawn(async move { store.append(req).await.unwrap().first_seq })
        });
        let mut firsts: Vec<u64> = futures::future::join_all(appends)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        firsts.sort_unstable();
        assert_eq!(firsts, (0..16).map(|i| 2 * i + 1).collect::<Vec<_>>());
    })
    .await;
}

#[test]
fn pure_helpers() {
    let active: Vec<String> = RunStatus::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    assert_eq!(format!("({})", active.join(", ")), active_statuses!());
    assert!(checked_schema("ok_1").is_ok());
    assert!(checked_schema("Bad\"").is_err() && checked_schema("").is_err());
}

/// A database migrated before settings existed: migration 5 gives its
/// session rows `"{}"`, and they can be patched.
#[tokio::test]
async fn sessions_from_before_settings_read_empty_settings() {
    with_schema(|schema| async move {
        let (client, connection) = url()
            .parse::<tokio_postgres::Config>()
            .unwrap()
            .connect(NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let session_id = Uuid::new_v4();
        let mut sql = format!(
            "CREATE SCHEMA \"{schema}\"; SET search_path TO \"{schema}\"; \
             CREATE TABLE schema_migrations (version bigint PRIMARY KEY, \
             applied_at timestamptz NOT NULL DEFAULT now());"
        );
        for (version, migration) in MIGRATIONS.iter().filter(|(v, _)| *v < 5) {
            sql.push_str(migration);
            sql.push_str(&format!(
                "\nINSERT INTO schema_migrations (version) VALUES ({version});"
            ));
        }
        sql.push_str(&format!(
            "INSERT INTO sessions (session_key, last_fence, session_id, created_at_ms, \
             updated_at_ms, label) VALUES ('agent:main:old', 2, '{session_id}', 1, 2, 'old one');"
        ));
        client.batch_execute(&sql).await.unwrap();
        drop(client);
        let _ = driver.await;

        let store = open(&schema).await;
        let k = key("old");
        let session = store.get_session(&k).await.unwrap().unwrap();
        assert_eq!(session.session_id, session_id);
        assert_eq!(session.settings_json, "{}");
        assert_eq!(session.label.as_deref(), Some("old one"));
        let patched = store
            .patch_session(PatchSession {
                key: k.clone(),
                patch_json: r#"{"archived":true,"label":null}"#.into(),
                create: false,
            })
            .await
            .unwrap();
        assert_eq!(patched.session.settings_json, r#"{"archived":true}"#);
        assert_eq!(patched.session.label, None);
        assert_eq!(patched.session.fence_token, 2);
        // A delete leaves the row (its fence) without settings.
        store.delete_session(&k, true).await.unwrap();
        let client = store.client().await.unwrap();
        let row = fetch_opt(&client, SELECT_SESSION, &[&k.as_str()])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(col::<String>(&row, 11).unwrap(), "{}");
    })
    .await;
}

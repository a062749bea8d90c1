//! The backend-agnostic conformance suite. Every function takes a fresh, empty
//! store; `conformance.rs` runs all of them against each backend, and
//! `grpc.rs` runs them again through the gRPC server and remote client.
#![allow(dead_code)]

pub mod harness;
pub mod members;
pub mod ownership;
pub mod run_lifecycle;
pub mod settings;

#[allow(unused_imports)] // used by the conformance_cases! macro, not by every test crate
pub use members::*;
#[allow(unused_imports)] // used by the conformance_cases! macro, not by every test crate
pub use ownership::*;
#[allow(unused_imports)] // used by the conformance_cases! macro, not by every test crate
pub use run_lifecycle::*;
#[allow(unused_imports)] // used by the conformance_cases! macro, not by every test crate
pub use settings::*;

use session_store::model::*;
use session_store::{SessionKey, SessionStore, StoreError};

pub fn key(raw: &str) -> SessionKey {
    SessionKey::parse(raw).unwrap()
}

pub fn text_entry(role: &str, text: &str) -> NewEntry {
    NewEntry {
        role: role.to_owned(),
        content_json: serde_json::json!([{ "type": "text", "text": text }]).to_string(),
        timestamp_ms: None,
        metadata: EntryMetadata::default(),
    }
}

pub fn acquire_req(
    k: &SessionKey,
    run: &str,
    expected: Option<&str>,
    mode: AcquireMode,
) -> AcquireWriter {
    AcquireWriter {
        owner_token: None,
        key: k.clone(),
        expected_session: ExpectedSession::Current,
        expected_writer: expected.map(str::to_owned),
        run_id: run.to_owned(),
        mode,
        label: None,
    }
}

pub async fn acquire(store: &dyn SessionStore, k: &SessionKey, run: &str) -> Acquired {
    store
        .acquire_writer(acquire_req(k, run, None, AcquireMode::Cas))
        .await
        .expect("acquire a free slot")
}

pub async fn takeover(store: &dyn SessionStore, k: &SessionKey, run: &str) -> Acquired {
    store
        .acquire_writer(acquire_req(k, run, None, AcquireMode::Takeover))
        .await
        .expect("takeover")
}

pub fn append_req(k: &SessionKey, held: &Acquired, run: &str, texts: &[&str]) -> AppendEntries {
    AppendEntries {
        owner_token: None,
        key: k.clone(),
        session_id: held.session.session_id,
        run_id: run.to_owned(),
        fence_token: held.fence_token,
        entries: texts.iter().map(|t| text_entry("assistant", t)).collect(),
    }
}

pub async fn history_all(store: &dyn SessionStore, k: &SessionKey) -> HistoryPage {
    store
        .history(HistoryQuery {
            key: k.clone(),
            limit: 1000,
            cursor: HistoryCursor::Latest,
            max_chars: None,
            session_id: None,
        })
        .await
        .unwrap()
}

/// A whole transcript (the key's current one, or `session_id`), read page by
/// page forwards.
pub async fn transcript(
    store: &dyn SessionStore,
    k: &SessionKey,
    session_id: Option<SessionId>,
) -> Vec<TranscriptEntry> {
    let mut entries = Vec::new();
    loop {
        let page = store
            .history(HistoryQuery {
                key: k.clone(),
                limit: 1000,
                cursor: HistoryCursor::After(entries.len() as u64),
                max_chars: None,
                session_id,
            })
            .await
            .unwrap();
        entries.extend(page.entries);
        if !page.has_more {
            return entries;
        }
    }
}

/// The text of a one-part entry written by `text_entry`.
pub fn text_of(entry: &TranscriptEntry) -> String {
    let parts: serde_json::Value = serde_json::from_str(&entry.content_json).unwrap();
    parts[0]["text"].as_str().unwrap().to_owned()
}

fn texts(page: &HistoryPage) -> Vec<String> {
    page.entries.iter().map(text_of).collect()
}

fn seqs(page: &HistoryPage) -> Vec<u64> {
    page.entries.iter().map(|e| e.seq).collect()
}

pub fn new_run(run_id: &str, k: &SessionKey, fingerprint: &str) -> NewRun {
    NewRun {
        owner_token: None,
        run_id: run_id.to_owned(),
        session_key: k.clone(),
        kind: "agent".to_owned(),
        fingerprint: fingerprint.to_owned(),
        status: RunStatus::Accepted,
        owner: "coordinator-1".to_owned(),
        request_json: r#"{"message":"hi"}"#.to_owned(),
        expected_settings: None,
        create_session: false,
    }
}

pub fn update(run_id: &str, expected_version: u64, status: RunStatus) -> RunUpdate {
    RunUpdate {
        owner_token: None,
        run_id: run_id.to_owned(),
        expected_version,
        status,
        owner: None,
        outcome_json: None,
        session_id: None,
        fence_token: None,
    }
}

// ---- the cases ------------------------------------------------------------------

pub async fn acquire_when_free(store: &dyn SessionStore) {
    let k = key("main");
    let got = acquire(store, &k, "run-1").await;
    assert!(got.session_created);
    assert_eq!(got.fence_token, 1);
    assert_eq!(got.superseded_run_id, None);
    assert_eq!(got.session.key.as_str(), "agent:main:main");
    assert_eq!(got.session.active_writer_run_id.as_deref(), Some("run-1"));
    assert_eq!(got.session.fence_token, 1);
    assert_eq!(got.session.entry_count, 0);
    let seen = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(seen.session_id, got.session.session_id);
    assert_eq!(seen.active_writer_run_id.as_deref(), Some("run-1"));
    assert_eq!(seen.last_run_id.as_deref(), Some("run-1"));

    // Expecting the exact sessionId works too, and does not create anew.
    store.release_writer(&k, "run-1", 1, None).await.unwrap();
    let mut req = acquire_req(&k, "run-2", None, AcquireMode::Cas);
    req.expected_session = ExpectedSession::Id(got.session.session_id);
    let again = store.acquire_writer(req).await.unwrap();
    assert!(!again.session_created);
    assert_eq!(again.fence_token, 2);
    assert_eq!(again.session.session_id, got.session.session_id);
}

pub async fn cas_conflict_returns_current(store: &dyn SessionStore) {
    let k = key("cas");
    let held = acquire(store, &k, "run-a").await;

    let err = store
        .acquire_writer(acquire_req(&k, "run-b", None, AcquireMode::Cas))
        .await
        .unwrap_err();
    let StoreError::WriterConflict { current, .. } = &err else {
        panic!("expected WriterConflict, got {err:?}");
    };
    let current = current.as_deref().unwrap();
    assert_eq!(current.active_writer_run_id.as_deref(), Some("run-a"));
    assert_eq!(current.fence_token, held.fence_token);
    assert_eq!(current.session_id, held.session.session_id);

    // Expecting the wrong writer fails the same way.
    let err = store
        .acquire_writer(acquire_req(&k, "run-b", Some("run-x"), AcquireMode::Cas))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::WriterConflict { .. }), "{err:?}");

    // Expecting the right writer succeeds (an explicit handover).
    let handed = store
        .acquire_writer(acquire_req(&k, "run-b", Some("run-a"), AcquireMode::Cas))
        .await
        .unwrap();
    assert_eq!(handed.fence_token, held.fence_token + 1);
    assert_eq!(handed.superseded_run_id.as_deref(), Some("run-a"));

    // A wrong sessionId expectation: SESSION_REPLACED with current values.
    let mut req = acquire_req(&k, "run-c", Some("run-b"), AcquireMode::Takeover);
    let stale_id = uuid::Uuid::new_v4();
    req.expected_session = ExpectedSession::Id(stale_id);
    let err = store.acquire_writer(req).await.unwrap_err();
    let StoreError::SessionReplaced { current, .. } = &err else {
        panic!("expected SessionReplaced, got {err:?}");
    };
    assert_eq!(
        current.as_deref().unwrap().session_id,
        held.session.session_id
    );
    assert_eq!(
        current.as_deref().unwrap().active_writer_run_id.as_deref(),
        Some("run-b")
    );

    // Nothing changed through the failed attempts.
    let seen = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(seen.fence_token, handed.fence_token);
    assert_eq!(seen.active_writer_run_id.as_deref(), Some("run-b"));
}

pub async fn takeover_returns_old_run(store: &dyn SessionStore) {
    let k = key("takeover");
    let first = acquire(store, &k, "old").await;
    let second = takeover(store, &k, "new").await;
    assert_eq!(second.superseded_run_id.as_deref(), Some("old"));
    assert!(second.fence_token > first.fence_token);
    assert_eq!(second.session.active_writer_run_id.as_deref(), Some("new"));
    // Taking over a free slot supersedes nobody.
    store
        .release_writer(&k, "new", second.fence_token, None)
        .await
        .unwrap();
    let third = takeover(store, &k, "newer").await;
    assert_eq!(third.superseded_run_id, None);
    // Re-acquiring one's own slot refreshes the fence, supersedes nobody.
    let refreshed = store
        .acquire_writer(acquire_req(&k, "newer", Some("newer"), AcquireMode::Cas))
        .await
        .unwrap();
    assert_eq!(refreshed.superseded_run_id, None);
    assert!(refreshed.fence_token > third.fence_token);
}

async fn assert_append_rejected(
    store: &dyn SessionStore,
    req: AppendEntries,
    expect_code: &str,
    entries_before: u64,
) {
    let k = req.key.clone();
    let err = store.append(req).await.unwrap_err();
    assert_eq!(err.code(), expect_code, "{err:?}");
    let page = history_all(store, &k).await;
    assert_eq!(
        page.total, entries_before,
        "a rejected append wrote nothing"
    );
}

pub async fn append_rejected_after_takeover(store: &dyn SessionStore) {
    let k = key("after-takeover");
    let old = acquire(store, &k, "old").await;
    store
        .append(append_req(&k, &old, "old", &["one"]))
        .await
        .unwrap();
    let new = takeover(store, &k, "new").await;
    assert_append_rejected(
        store,
        append_req(&k, &old, "old", &["late"]),
        "STALE_WRITER",
        1,
    )
    .await;
    let err = store
        .append(append_req(&k, &old, "old", &["late"]))
        .await
        .unwrap_err();
    let current = err.current_session().expect("current values returned");
    assert_eq!(current.active_writer_run_id.as_deref(), Some("new"));
    assert_eq!(current.fence_token, new.fence_token);
    store
        .append(append_req(&k, &new, "new", &["two"]))
        .await
        .unwrap();
}

pub async fn append_rejected_after_reset(store: &dyn SessionStore) {
    let k = key("after-reset");
    let held = acquire(store, &k, "run").await;
    let reset = store.reset_session(&k).await.unwrap();
    assert_eq!(reset.superseded_run_id.as_deref(), Some("run"));
    assert_eq!(reset.previous_session_id, Some(held.session.session_id));
    assert_ne!(reset.session.session_id, held.session.session_id);
    assert_eq!(reset.session.active_writer_run_id, None);
    let err = store
        .append(append_req(&k, &held, "run", &["late"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "SESSION_REPLACED", "{err:?}");
    assert_eq!(
        err.current_session().unwrap().session_id,
        reset.session.session_id
    );
    assert_eq!(history_all(store, &k).await.total, 0);
}

pub async fn append_rejected_after_release(store: &dyn SessionStore) {
    let k = key("after-release");
    let held = acquire(store, &k, "run").await;
    let released = store
        .release_writer(&k, "run", held.fence_token, None)
        .await
        .unwrap();
    assert!(released.released);
    assert_eq!(released.session.unwrap().active_writer_run_id, None);
    assert_append_rejected(
        store,
        append_req(&k, &held, "run", &["late"]),
        "STALE_WRITER",
        0,
    )
    .await;
    // A second release (a retry) changes nothing.
    let again = store
        .release_writer(&k, "run", held.fence_token, None)
        .await
        .unwrap();
    assert!(!again.released);
}

pub async fn append_rejected_with_wrong_fence(store: &dyn SessionStore) {
    let k = key("wrong-fence");
    let held = acquire(store, &k, "run").await;
    let mut wrong = append_req(&k, &held, "run", &["x"]);
    wrong.fence_token = held.fence_token + 1;
    assert_append_rejected(store, wrong, "STALE_WRITER", 0).await;
    let mut wrong = append_req(&k, &held, "run", &["x"]);
    wrong.fence_token = held.fence_token - 1;
    assert_append_rejected(store, wrong, "STALE_WRITER", 0).await;
    // Right fence, wrong run.
    assert_append_rejected(
        store,
        append_req(&k, &held, "other", &["x"]),
        "STALE_WRITER",
        0,
    )
    .await;
    // A release with the wrong fence does not release.
    let released = store
        .release_writer(&k, "run", held.fence_token + 7, None)
        .await
        .unwrap();
    assert!(!released.released);
    store
        .append(append_req(&k, &held, "run", &["ok"]))
        .await
        .unwrap();
}

pub async fn fence_strictly_increases(store: &dyn SessionStore) {
    let k = key("fences");
    let mut last = 0;
    let mut next = |fence: u64| {
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
    };
    next(acquire(store, &k, "r1").await.fence_token);
    next(takeover(store, &k, "r2").await.fence_token);
    store.reset_session(&k).await.unwrap();
    next(acquire(store, &k, "r3").await.fence_token);
    let deleted = store.delete_session(&k, true).await.unwrap();
    assert!(deleted.deleted);
    assert_eq!(deleted.superseded_run_id.as_deref(), Some("r3"));
    assert!(store.get_session(&k).await.unwrap().is_none());
    let recreated = acquire(store, &k, "r4").await;
    assert!(recreated.session_created);
    next(recreated.fence_token);
    next(takeover(store, &k, "r5").await.fence_token);
}

pub async fn transcript_seq_has_no_gaps(store: &dyn SessionStore) {
    let k = key("seq");
    let held = acquire(store, &k, "run").await;
    let a = store
        .append(append_req(&k, &held, "run", &["a", "b"]))
        .await
        .unwrap();
    assert_eq!((a.first_seq, a.last_seq), (1, 2));
    let b = store
        .append(append_req(&k, &held, "run", &["c"]))
        .await
        .unwrap();
    assert_eq!((b.first_seq, b.last_seq), (3, 3));
    assert_eq!(b.session.entry_count, 3);
    let page = history_all(store, &k).await;
    assert_eq!(seqs(&page), vec![1, 2, 3]);
    assert_eq!(texts(&page), vec!["a", "b", "c"]);
    assert_eq!(page.total, 3);
    assert!(!page.has_more);
    assert_eq!(page.session_id, Some(held.session.session_id));
    let entry = &page.entries[0];
    assert_eq!(entry.run_id, "run");
    assert_eq!(entry.role, "assistant");
    assert!(entry.timestamp_ms > 0);

    // Metadata and explicit timestamps round-trip.
    let mut req = append_req(&k, &held, "run", &["partial"]);
    req.entries[0].timestamp_ms = Some(1_700_000_000_000);
    req.entries[0].metadata = EntryMetadata {
        stop_reason: Some("aborted".into()),
        usage_json: Some(r#"{"input":3,"output":4}"#.into()),
        aborted: true,
    };
    store.append(req).await.unwrap();
    let last = history_all(store, &k).await.entries.pop().unwrap();
    assert_eq!(last.seq, 4);
    assert_eq!(last.timestamp_ms, 1_700_000_000_000);
    assert!(last.metadata.aborted);
    assert_eq!(last.metadata.stop_reason.as_deref(), Some("aborted"));
    assert_eq!(
        last.metadata.usage_json.as_deref(),
        Some(r#"{"input":3,"output":4}"#)
    );

    // After a reset the new sessionId starts again from seq 1.
    store.reset_session(&k).await.unwrap();
    let held = acquire(store, &k, "run2").await;
    let c = store
        .append(append_req(&k, &held, "run2", &["fresh"]))
        .await
        .unwrap();
    assert_eq!(c.first_seq, 1);
}

pub async fn history_paging_and_max_chars(store: &dyn SessionStore) {
    let k = key("paging");
    let held = acquire(store, &k, "run").await;
    let all: Vec<String> = (1..=10).map(|i| format!("m{i:02}")).collect();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    store
        .append(append_req(&k, &held, "run", &refs))
        .await
        .unwrap();
    let query = |limit, cursor, max_chars| HistoryQuery {
        key: k.clone(),
        limit,
        cursor,
        max_chars,
        session_id: None,
    };
    // The newest page, then backwards.
    let page = store
        .history(query(4, HistoryCursor::Latest, None))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![7, 8, 9, 10]);
    assert!(page.has_more);
    assert_eq!(page.total, 10);
    let page = store
        .history(query(4, HistoryCursor::Before(7), None))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![3, 4, 5, 6]);
    assert!(page.has_more);
    let page = store
        .history(query(4, HistoryCursor::Before(3), None))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![1, 2]);
    assert!(!page.has_more);
    // Forwards.
    let page = store
        .history(query(4, HistoryCursor::After(8), None))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![9, 10]);
    assert!(!page.has_more);
    let page = store
        .history(query(3, HistoryCursor::After(0), None))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![1, 2, 3]);
    assert!(page.has_more);
    let page = store
        .history(query(3, HistoryCursor::After(10), None))
        .await
        .unwrap();
    assert!(page.entries.is_empty());
    assert!(!page.has_more);

    // maxChars: each content_json here is the same length.
    let one = page_entry_chars(store, &k).await;
    let page = store
        .history(query(10, HistoryCursor::Latest, Some((one * 3) as u32)))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![8, 9, 10], "the newest that fit");
    assert!(page.has_more);
    let page = store
        .history(query(
            10,
            HistoryCursor::After(0),
            Some((one * 2 + 1) as u32),
        ))
        .await
        .unwrap();
    assert_eq!(
        seqs(&page),
        vec![1, 2],
        "the oldest that fit going forwards"
    );
    assert!(page.has_more);
    // A budget smaller than one entry still returns one, so paging progresses.
    let page = store
        .history(query(10, HistoryCursor::Latest, Some(1)))
        .await
        .unwrap();
    assert_eq!(seqs(&page), vec![10]);
    assert!(page.has_more);
}

async fn page_entry_chars(store: &dyn SessionStore, k: &SessionKey) -> usize {
    history_all(store, k).await.entries[0]
        .content_json
        .chars()
        .count()
}

pub async fn history_of_an_earlier_session_id(store: &dyn SessionStore) {
    let k = key("archived");
    let held = acquire(store, &k, "run").await;
    store
        .append(append_req(&k, &held, "run", &["old-1", "old-2", "old-3"]))
        .await
        .unwrap();
    let reset = store.reset_session(&k).await.unwrap();
    let query = |session_id, cursor| HistoryQuery {
        key: k.clone(),
        limit: 2,
        cursor,
        max_chars: None,
        session_id,
    };
    // The key's history is the new, empty transcript.
    let current = store
        .history(query(None, HistoryCursor::Latest))
        .await
        .unwrap();
    assert_eq!(current.session_id, Some(reset.session.session_id));
    assert_eq!(current.total, 0);
    // The replaced transcript is still readable by its sessionId, with paging.
    let old_id = held.session.session_id;
    let page = store
        .history(query(Some(old_id), HistoryCursor::Latest))
        .await
        .unwrap();
    assert_eq!(page.session_id, Some(old_id));
    assert_eq!(page.total, 3);
    assert_eq!(texts(&page), vec!["old-2", "old-3"]);
    assert!(page.has_more);
    let page = store
        .history(query(Some(old_id), HistoryCursor::Before(2)))
        .await
        .unwrap();
    assert_eq!(texts(&page), vec!["old-1"]);
    assert!(!page.has_more);
    // Asking for the current sessionId explicitly is the same as not asking.
    let same = store
        .history(query(Some(reset.session.session_id), HistoryCursor::Latest))
        .await
        .unwrap();
    assert_eq!(same.total, 0);
    // An unknown sessionId is an empty transcript.
    let unknown = store
        .history(query(Some(uuid::Uuid::new_v4()), HistoryCursor::Latest))
        .await
        .unwrap();
    assert_eq!(unknown.total, 0);
    assert!(unknown.entries.is_empty());
}

pub async fn unknown_key_has_empty_history(store: &dyn SessionStore) {
    let page = history_all(store, &key("never-seen")).await;
    assert!(page.entries.is_empty());
    assert_eq!(page.session_id, None);
    assert_eq!(page.total, 0);
    assert!(!page.has_more);
    assert!(
        store
            .get_session(&key("never-seen"))
            .await
            .unwrap()
            .is_none()
    );
    let released = store
        .release_writer(&key("never-seen"), "run", 1, None)
        .await
        .unwrap();
    assert!(!released.released);
}

pub async fn list_sessions_newest_first(store: &dyn SessionStore) {
    for (name, label) in [
        ("alpha", "Project Alpha"),
        ("beta", "beta notes"),
        ("gamma", ""),
    ] {
        let mut req = acquire_req(&key(name), "run", None, AcquireMode::Cas);
        req.label = (!label.is_empty()).then(|| label.to_owned());
        store.acquire_writer(req).await.unwrap();
        // Distinct updated_at for a stable order.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let all = store
        .list_sessions(ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let keys: Vec<&str> = all.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(
        keys,
        vec!["agent:main:gamma", "agent:main:beta", "agent:main:alpha"]
    );
    let two = store
        .list_sessions(ListQuery {
            limit: 2,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    let by_label = store
        .list_sessions(ListQuery {
            limit: 10,
            search: Some("ALPHA".into()),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(by_label.len(), 1);
    assert_eq!(by_label[0].label.as_deref(), Some("Project Alpha"));
    let by_key = store
        .list_sessions(ListQuery {
            limit: 10,
            search: Some("main:be".into()),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(by_key.len(), 1);
    let none_recent = store
        .list_sessions(ListQuery {
            limit: 10,
            updated_since_ms: Some(clawgate_common::clock::now_ms() + 60_000),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert!(none_recent.is_empty());
    // A deleted session is not listed.
    store.delete_session(&key("beta"), false).await.unwrap();
    let after = store
        .list_sessions(ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(after.len(), 2);
}

pub async fn delete_session_and_transcript(store: &dyn SessionStore) {
    let k = key("delete-me");
    let held = acquire(store, &k, "run").await;
    store
        .append(append_req(&k, &held, "run", &["a"]))
        .await
        .unwrap();
    let out = store.delete_session(&k, false).await.unwrap();
    assert!(out.deleted);
    assert_eq!(out.previous_session_id, Some(held.session.session_id));
    assert!(history_all(store, &k).await.entries.is_empty());
    let err = store
        .append(append_req(&k, &held, "run", &["late"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "SESSION_REPLACED");
    let again = store.delete_session(&k, true).await.unwrap();
    assert!(!again.deleted);
    let unknown = store.delete_session(&key("nobody"), true).await.unwrap();
    assert!(!unknown.deleted);
}

pub async fn reset_unknown_key_creates_session(store: &dyn SessionStore) {
    let k = key("fresh-reset");
    let out = store.reset_session(&k).await.unwrap();
    assert_eq!(out.previous_session_id, None);
    assert_eq!(out.superseded_run_id, None);
    let seen = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(seen.session_id, out.session.session_id);
}

pub async fn run_create_if_absent(store: &dyn SessionStore) {
    let k = key("runs");
    let created = store
        .create_run(new_run("idem-1", &k, "fp-a"))
        .await
        .unwrap();
    assert!(created.created);
    assert!(!created.fingerprint_mismatch);
    assert_eq!(created.record.version, 1);
    assert_eq!(created.record.status, RunStatus::Accepted);
    assert_eq!(created.record.session_key, "agent:main:runs");
    assert_eq!(created.record.request_json, r#"{"message":"hi"}"#);

    let retry = store
        .create_run(new_run("idem-1", &k, "fp-a"))
        .await
        .unwrap();
    assert!(!retry.created);
    assert!(!retry.fingerprint_mismatch);
    assert_eq!(retry.record, created.record);

    let reused = store
        .create_run(new_run("idem-1", &k, "fp-b"))
        .await
        .unwrap();
    assert!(!reused.created);
    assert!(reused.fingerprint_mismatch);
    assert_eq!(reused.record.fingerprint, "fp-a", "the record is unchanged");

    assert_eq!(store.get_run("idem-1").await.unwrap(), Some(created.record));
    assert_eq!(store.get_run("idem-unknown").await.unwrap(), None);
}

pub async fn run_update_is_cas(store: &dyn SessionStore) {
    let k = key("run-cas");
    let held = acquire(store, &k, "r").await;
    store.create_run(new_run("r", &k, "fp")).await.unwrap();
    let mut running = update("r", 1, RunStatus::Running);
    running.session_id = Some(held.session.session_id);
    running.fence_token = Some(held.fence_token);
    running.owner = Some("coordinator-2".into());
    let v2 = store.update_run(running).await.unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(v2.status, RunStatus::Running);
    assert!(v2.started_at_ms.is_some());
    assert_eq!(v2.session_id, Some(held.session.session_id));
    assert_eq!(v2.fence_token, Some(held.fence_token));
    assert_eq!(v2.owner, "coordinator-2");

    // A stale version loses and learns the current record.
    let err = store
        .update_run(update("r", 1, RunStatus::Ok))
        .await
        .unwrap_err();
    let StoreError::RunVersionConflict { current, .. } = &err else {
        panic!("expected RunVersionConflict, got {err:?}");
    };
    assert_eq!(current.version, 2);

    let mut aborted = update("r", 2, RunStatus::Aborted);
    aborted.outcome_json = Some(r#"{"stopReason":"aborted"}"#.into());
    let v3 = store.update_run(aborted).await.unwrap();
    assert_eq!(v3.version, 3);
    assert!(v3.ended_at_ms.is_some());
    assert_eq!(
        v3.outcome_json.as_deref(),
        Some(r#"{"stopReason":"aborted"}"#)
    );
    let listed = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(listed.last_run_status, Some(RunStatus::Aborted));

    // Terminal is final, even with the right version.
    let err = store
        .update_run(update("r", 3, RunStatus::Ok))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "RUN_TERMINAL", "{err:?}");
    assert_eq!(
        store.get_run("r").await.unwrap().unwrap().status,
        RunStatus::Aborted
    );

    let err = store
        .update_run(update("missing", 1, RunStatus::Ok))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "RUN_NOT_FOUND");
}

pub async fn retention_removes_only_terminal_runs(store: &dyn SessionStore) {
    let k = key("retention");
    for id in ["active-accepted", "active-running", "done-ok", "done-error"] {
        store.create_run(new_run(id, &k, "fp")).await.unwrap();
    }
    store
        .update_run(update("active-running", 1, RunStatus::Running))
        .await
        .unwrap();
    store
        .update_run(update("done-ok", 1, RunStatus::Ok))
        .await
        .unwrap();
    store
        .update_run(update("done-error", 1, RunStatus::Error))
        .await
        .unwrap();

    let mut active: Vec<String> = store
        .list_active_runs(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    active.sort();
    assert_eq!(active, vec!["active-accepted", "active-running"]);
    assert_eq!(
        store
            .list_active_runs(Some("someone-else"))
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        store
            .list_active_runs(Some("coordinator-1"))
            .await
            .unwrap()
            .len(),
        2
    );

    // A cutoff before the runs ended removes nothing.
    assert_eq!(store.purge_expired_runs(0).await.unwrap(), 0);
    // A cutoff in the future removes exactly the terminal ones.
    let future = clawgate_common::clock::now_ms() + 1_000;
    assert_eq!(store.purge_expired_runs(future).await.unwrap(), 2);
    assert!(store.get_run("done-ok").await.unwrap().is_none());
    assert!(store.get_run("done-error").await.unwrap().is_none());
    assert!(store.get_run("active-accepted").await.unwrap().is_some());
    assert!(store.get_run("active-running").await.unwrap().is_some());
    // A purged key may be created anew.
    assert!(
        store
            .create_run(new_run("done-ok", &k, "fp"))
            .await
            .unwrap()
            .created
    );
}

/// Every case of the suite, by name.
#[macro_export]
macro_rules! conformance_cases {
    ($make:path) => {
        $crate::conformance_cases!(@each $make;
            acquire_when_free,
            cas_conflict_returns_current,
            takeover_returns_old_run,
            append_rejected_after_takeover,
            append_rejected_after_reset,
            append_rejected_after_release,
            append_rejected_with_wrong_fence,
            fence_strictly_increases,
            transcript_seq_has_no_gaps,
            history_paging_and_max_chars,
            unknown_key_has_empty_history,
            history_of_an_earlier_session_id,
            list_sessions_newest_first,
            delete_session_and_transcript,
            reset_unknown_key_creates_session,
            run_create_if_absent,
            run_update_is_cas,
            retention_removes_only_terminal_runs,
            every_partition_has_a_lease,
            leases_take_renew_release,
            a_steal_fences_every_write_of_the_old_owner,
            owner_tokens_are_checked,
            an_expired_lease_is_taken_and_its_epoch_fenced,
            a_take_is_ordered_after_the_old_tenures_writes,
            members_heartbeat_creates_and_lists,
            a_member_heartbeat_extends_its_entry,
            a_member_leaves_at_once,
            an_expired_member_is_never_listed,
            the_member_registry_is_capped,
            bad_member_requests_are_refused,
            settings_merge_patch_top_level,
            settings_label_is_the_label_column,
            settings_patch_must_be_an_object,
            settings_patch_creates_or_refuses,
            settings_survive_reset_not_delete,
            settings_size_limit,
            settings_patch_needs_no_owner_token,
            create_run_checks_the_settings_it_was_made_from,
            create_run_creates_a_new_session_in_the_same_write,
            start_run_is_one_commit,
            start_run_history_is_bounded,
            a_refused_start_run_writes_nothing,
            finish_run_is_one_commit,
            a_stale_finish_run_writes_nothing,
            finish_run_checks_its_request,
        );
        // The cases that spawn tasks of their own take the shared store.
        $crate::conformance_cases!(@shared $make;
            concurrent_settings_patches_all_land,
        );
    };
    (@each $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make().await;
                $crate::suite::$case(harness.store()).await;
                harness.finish().await;
            }
        )*
    };
    (@shared $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make().await;
                $crate::suite::$case(harness.shared()).await;
                harness.finish().await;
            }
        )*
    };
}

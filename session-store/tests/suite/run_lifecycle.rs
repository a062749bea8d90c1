//! The run-lifecycle cases of the conformance suite: StartRun and FinishRun,
//! each one commit that either does everything the calls it folds would do
//! (UpdateRun, AcquireWriter, Append; Append, UpdateRun, ReleaseWriter) or
//! nothing at all.

use session_store::model::*;
use session_store::{SessionKey, SessionStore, StoreError};

use super::{acquire, append_req, key, new_run, takeover, text_entry, text_of, transcript};

pub fn start_req(k: &SessionKey, run: &str, expected_version: u64) -> StartRun {
    StartRun {
        run_id: run.to_owned(),
        key: k.clone(),
        expected_version,
        owner: "coordinator-2".to_owned(),
        mode: AcquireMode::Cas,
        expected_writer: None,
        label: Some("started".to_owned()),
        entries: vec![text_entry("user", &format!("{run} asks"))],
        history_limit: 10,
        owner_token: None,
    }
}

pub fn finish_req(k: &SessionKey, started: &Started, texts: &[&str]) -> FinishRun {
    FinishRun {
        run_id: started.record.run_id.clone(),
        key: k.clone(),
        expected_version: started.record.version,
        status: RunStatus::Ok,
        outcome_json: Some(r#"{"text":"done"}"#.to_owned()),
        writer: Some(HeldFence {
            session_id: started.acquired.session.session_id,
            fence_token: started.acquired.fence_token,
        }),
        entries: texts.iter().map(|t| text_entry("assistant", t)).collect(),
        owner_token: None,
    }
}

async fn texts(store: &dyn SessionStore, k: &SessionKey) -> Vec<String> {
    transcript(store, k, None)
        .await
        .iter()
        .map(text_of)
        .collect()
}

async fn record(store: &dyn SessionStore, run: &str) -> RunRecord {
    store.get_run(run).await.unwrap().expect("the run record")
}

pub async fn start_run_is_one_commit(store: &dyn SessionStore) {
    let k = key("start-run");
    // An earlier turn, so that there is history to return.
    store.create_run(new_run("r0", &k, "fp")).await.unwrap();
    let r0 = store.start_run(start_req(&k, "r0", 1)).await.unwrap();
    assert!(r0.acquired.session_created);
    assert!(r0.history.is_empty(), "a new session has no history");
    store
        .finish_run(finish_req(&k, &r0, &["r0 answers"]))
        .await
        .unwrap();

    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let started = store.start_run(start_req(&k, "r1", 1)).await.unwrap();
    // The record: running, owned by the executor, with its fence.
    let r = &started.record;
    assert_eq!((r.status, r.version), (RunStatus::Running, 2));
    assert_eq!(r.owner, "coordinator-2");
    assert!(r.started_at_ms.is_some());
    assert_eq!(r.session_id, Some(started.acquired.session.session_id));
    assert_eq!(r.fence_token, Some(started.acquired.fence_token));
    assert_eq!(&record(store, "r1").await, r, "what it answers is stored");
    // The fence and the session as they are after the append.
    let session = &started.acquired.session;
    assert_eq!(started.acquired.fence_token, r0.acquired.fence_token + 1);
    assert!(!started.acquired.session_created);
    assert_eq!(session.active_writer_run_id.as_deref(), Some("r1"));
    assert_eq!(session.entry_count, 3);
    assert_eq!(session.last_run_status, Some(RunStatus::Running));
    assert_eq!(&store.get_session(&k).await.unwrap().unwrap(), session);
    // The user turn, and the history before it.
    assert_eq!(started.first_seq, 3);
    let history: Vec<String> = started.history.iter().map(text_of).collect();
    assert_eq!(history, ["r0 asks", "r0 answers"]);
    assert_eq!(texts(store, &k).await, ["r0 asks", "r0 answers", "r1 asks"]);
    let mut short = start_req(&k, "r-none", 1);
    short.history_limit = 1;
    store.create_run(new_run("r-none", &k, "fp")).await.unwrap();
    let err = store.start_run(short).await.unwrap_err();
    assert_eq!(err.code(), "WRITER_CONFLICT", "r1 holds the slot: {err:?}");
}

pub async fn start_run_history_is_bounded(store: &dyn SessionStore) {
    let k = key("start-history");
    let held = acquire(store, &k, "seed").await;
    let earlier: Vec<String> = (1..=5).map(|n| format!("e{n}")).collect();
    let refs: Vec<&str> = earlier.iter().map(String::as_str).collect();
    store
        .append(append_req(&k, &held, "seed", &refs))
        .await
        .unwrap();
    store
        .release_writer(&k, "seed", held.fence_token, None)
        .await
        .unwrap();
    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let mut req = start_req(&k, "r1", 1);
    req.history_limit = 2;
    let started = store.start_run(req).await.unwrap();
    let history: Vec<String> = started.history.iter().map(text_of).collect();
    assert_eq!(history, ["e4", "e5"], "the newest, in order");
    assert_eq!(started.first_seq, 6);

    store.create_run(new_run("r2", &k, "fp")).await.unwrap();
    let mut req = start_req(&k, "r2", 1);
    req.mode = AcquireMode::Takeover;
    req.history_limit = 0;
    req.entries.clear();
    let started = store.start_run(req).await.unwrap();
    assert!(started.history.is_empty(), "history_limit 0 asks for none");
    assert_eq!(started.first_seq, 0, "no entries, no seq");
    assert_eq!(started.acquired.superseded_run_id.as_deref(), Some("r1"));
    assert_eq!(started.acquired.session.entry_count, 6);
}

/// Every refusal of a StartRun leaves the record, the slot and the
/// transcript as they were.
pub async fn a_refused_start_run_writes_nothing(store: &dyn SessionStore) {
    let k = key("start-refused");
    let holder = acquire(store, &k, "holder").await;
    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let before = (
        record(store, "r1").await,
        store.get_session(&k).await.unwrap(),
        texts(store, &k).await,
    );
    let after = async || {
        (
            record(store, "r1").await,
            store.get_session(&k).await.unwrap(),
            texts(store, &k).await,
        )
    };

    // The slot is held (CAS on a free slot).
    let err = store.start_run(start_req(&k, "r1", 1)).await.unwrap_err();
    match &err {
        StoreError::WriterConflict { current, .. } => {
            let holder_id = current
                .as_ref()
                .and_then(|s| s.active_writer_run_id.as_deref());
            assert_eq!(holder_id, Some("holder"));
        }
        other => panic!("expected WRITER_CONFLICT, got {other:?}"),
    }
    assert_eq!(after().await, before);
    // The record's version moved on.
    let mut req = start_req(&k, "r1", 7);
    req.expected_writer = Some("holder".into());
    let err = store.start_run(req).await.unwrap_err();
    assert_eq!(err.code(), "RUN_VERSION_CONFLICT", "{err:?}");
    assert_eq!(after().await, before);
    // Another session's key.
    let mut req = start_req(&key("elsewhere"), "r1", 1);
    req.mode = AcquireMode::Takeover;
    let err = store.start_run(req).await.unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(
        store
            .get_session(&key("elsewhere"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(after().await, before);
    // No such run.
    let err = store
        .start_run(start_req(&k, "nobody", 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "RUN_NOT_FOUND", "{err:?}");
    assert_eq!(after().await, before);
    // A terminal run never starts.
    let mut done = super::update("r1", 1, RunStatus::Aborted);
    done.outcome_json = Some("{}".into());
    let aborted = store.update_run(done).await.unwrap();
    let mut req = start_req(&k, "r1", aborted.version);
    req.expected_writer = Some("holder".into());
    let err = store.start_run(req).await.unwrap_err();
    assert_eq!(err.code(), "RUN_TERMINAL", "{err:?}");
    let session = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(session.active_writer_run_id.as_deref(), Some("holder"));
    assert_eq!(
        session.fence_token, holder.fence_token,
        "no fence was issued"
    );
}

pub async fn finish_run_is_one_commit(store: &dyn SessionStore) {
    let k = key("finish-run");
    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let started = store.start_run(start_req(&k, "r1", 1)).await.unwrap();
    let finished = store
        .finish_run(finish_req(&k, &started, &["r1 answers", "and more"]))
        .await
        .unwrap();
    let r = &finished.record;
    assert_eq!((r.status, r.version), (RunStatus::Ok, 3));
    assert!(r.ended_at_ms.is_some());
    assert_eq!(r.outcome_json.as_deref(), Some(r#"{"text":"done"}"#));
    assert_eq!(r.fence_token, Some(started.acquired.fence_token));
    assert_eq!(&record(store, "r1").await, r);
    assert_eq!((finished.first_seq, finished.released), (2, true));
    let session = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(session.active_writer_run_id, None, "released");
    assert_eq!(session.last_run_status, Some(RunStatus::Ok));
    assert_eq!(session.entry_count, 3);
    assert_eq!(
        texts(store, &k).await,
        ["r1 asks", "r1 answers", "and more"]
    );
    // Terminal is final: a second finish changes nothing.
    let mut again = finish_req(&k, &started, &[]);
    again.expected_version = r.version;
    again.status = RunStatus::Error;
    let err = store.finish_run(again).await.unwrap_err();
    assert_eq!(err.code(), "RUN_TERMINAL", "{err:?}");
    assert_eq!(&record(store, "r1").await, r);
}

/// A run whose fence went stale cannot write its turn, and then nothing of
/// the FinishRun lands; the terminal record alone can still be written.
pub async fn a_stale_finish_run_writes_nothing(store: &dyn SessionStore) {
    let k = key("finish-stale");
    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let started = store.start_run(start_req(&k, "r1", 1)).await.unwrap();
    takeover(store, &k, "r2").await;
    let err = store
        .finish_run(finish_req(&k, &started, &["late"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "STALE_WRITER", "{err:?}");
    assert_eq!(record(store, "r1").await, started.record, "still running");
    assert_eq!(texts(store, &k).await, ["r1 asks"]);

    let mut alone = finish_req(&k, &started, &[]);
    alone.status = RunStatus::Superseded;
    let finished = store.finish_run(alone).await.unwrap();
    assert_eq!(finished.record.status, RunStatus::Superseded);
    assert!(!finished.released, "r2 holds the slot");
    let session = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(session.active_writer_run_id.as_deref(), Some("r2"));
    assert_eq!(texts(store, &k).await, ["r1 asks"]);
}

pub async fn finish_run_checks_its_request(store: &dyn SessionStore) {
    let k = key("finish-checked");
    store.create_run(new_run("r1", &k, "fp")).await.unwrap();
    let started = store.start_run(start_req(&k, "r1", 1)).await.unwrap();
    let mut running = finish_req(&k, &started, &[]);
    running.status = RunStatus::Running;
    let mut unfenced = finish_req(&k, &started, &["text"]);
    unfenced.writer = None;
    let mut elsewhere = finish_req(&k, &started, &[]);
    elsewhere.key = key("finish-elsewhere");
    for bad in [running, unfenced, elsewhere] {
        let err = store.finish_run(bad.clone()).await.unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{bad:?}: {err:?}");
    }
    assert_eq!(record(store, "r1").await, started.record);
    // A run that never took a fence ends without one.
    store.create_run(new_run("r2", &k, "fp")).await.unwrap();
    let mut never = finish_req(&k, &started, &[]);
    never.run_id = "r2".into();
    never.expected_version = 1;
    never.writer = None;
    never.status = RunStatus::Aborted;
    let finished = store.finish_run(never).await.unwrap();
    assert_eq!(finished.record.status, RunStatus::Aborted);
    assert!(!finished.released);
    let session = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(session.active_writer_run_id.as_deref(), Some("r1"));
}

//! The settings cases of the conformance suite: PatchSession's merge patch,
//! the label, creation, reset and delete, the size limit and concurrency.

use std::sync::Arc;

use serde_json::{Value, json};
use session_store::model::*;
use session_store::rules::DEFAULT_MAX_SETTINGS_BYTES;
use session_store::{SessionKey, SessionStore, StoreError};

use super::{acquire, append_req, history_all, key};

pub fn patch_req(k: &SessionKey, patch: Value, create: bool) -> PatchSession {
    PatchSession {
        key: k.clone(),
        patch_json: patch.to_string(),
        create,
    }
}

pub async fn patch(store: &dyn SessionStore, k: &SessionKey, patch: Value) -> PatchOutcome {
    store
        .patch_session(patch_req(k, patch, false))
        .await
        .expect("patch an existing session")
}

/// The settings of a session, parsed.
pub fn settings(session: &Session) -> Value {
    serde_json::from_str(&session.settings_json).expect("settings are JSON")
}

async fn stored_settings(store: &dyn SessionStore, k: &SessionKey) -> Value {
    settings(&store.get_session(k).await.unwrap().expect("the session"))
}

async fn search(store: &dyn SessionStore, needle: &str) -> Vec<Session> {
    store
        .list_sessions(ListQuery {
            limit: 10,
            search: Some(needle.to_owned()),
            ..ListQuery::default()
        })
        .await
        .unwrap()
}

pub async fn settings_merge_patch_top_level(store: &dyn SessionStore) {
    let k = key("settings-merge");
    let held = acquire(store, &k, "run").await;
    assert_eq!(held.session.settings_json, "{}", "a new session has none");
    store
        .append(append_req(&k, &held, "run", &["one"]))
        .await
        .unwrap();
    let before = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(before.settings_json, "{}");

    // Set.
    let out = patch(store, &k, json!({ "archived": true, "model": "gpt-5" })).await;
    assert!(!out.created);
    assert_eq!(
        settings(&out.session),
        json!({ "archived": true, "model": "gpt-5" })
    );
    assert!(out.session.updated_at_ms >= before.updated_at_ms);
    // Replace one, add one; the rest stays.
    let out = patch(store, &k, json!({ "model": "claude", "thinking": "high" })).await;
    assert_eq!(
        settings(&out.session),
        json!({ "archived": true, "model": "claude", "thinking": "high" })
    );
    // null removes; removing an absent key is no error.
    let out = patch(store, &k, json!({ "archived": null, "never-set": null })).await;
    assert_eq!(
        settings(&out.session),
        json!({ "model": "claude", "thinking": "high" })
    );
    // No deep merge: an object value replaces the old one whole.
    patch(store, &k, json!({ "ui": { "a": 1, "b": 2 } })).await;
    let out = patch(store, &k, json!({ "ui": { "a": 3 } })).await;
    assert_eq!(settings(&out.session)["ui"], json!({ "a": 3 }));
    // An empty patch changes no setting.
    let out = patch(store, &k, json!({})).await;
    assert_eq!(
        settings(&out.session),
        json!({ "model": "claude", "thinking": "high", "ui": { "a": 3 } })
    );
    assert_eq!(
        stored_settings(store, &k).await,
        settings(&out.session),
        "what the patch returned is what is stored"
    );

    // The writer, its fence, the transcript and the last run are untouched.
    let after = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(after.session_id, before.session_id);
    assert_eq!(after.active_writer_run_id.as_deref(), Some("run"));
    assert_eq!(after.fence_token, held.fence_token);
    assert_eq!(after.entry_count, 1);
    assert_eq!(after.last_run_id, before.last_run_id);
    assert_eq!(after.last_run_status, before.last_run_status);
    assert!(after.updated_at_ms >= before.updated_at_ms);
    // So the writer still appends with the fence it holds.
    let appended = store
        .append(append_req(&k, &held, "run", &["two"]))
        .await
        .unwrap();
    assert_eq!(appended.first_seq, 2);
    assert_eq!(
        settings(&appended.session)["model"],
        "claude",
        "every session view carries the settings"
    );
    assert_eq!(history_all(store, &k).await.total, 2);
}

pub async fn settings_label_is_the_label_column(store: &dyn SessionStore) {
    let k = key("settings-label");
    acquire(store, &k, "run").await;
    let out = patch(
        store,
        &k,
        json!({ "label": "Project Zeta", "pinned": true }),
    )
    .await;
    assert_eq!(out.session.label.as_deref(), Some("Project Zeta"));
    assert_eq!(
        settings(&out.session),
        json!({ "pinned": true }),
        "label is not kept in the settings"
    );
    let found = search(store, "ZETA").await;
    assert_eq!(found.len(), 1, "the label is searchable");
    assert_eq!(found[0].key, k);
    assert_eq!(settings(&found[0]), json!({ "pinned": true }));

    // A patch without label leaves it; a new string replaces it.
    let out = patch(store, &k, json!({ "pinned": false })).await;
    assert_eq!(out.session.label.as_deref(), Some("Project Zeta"));
    let out = patch(store, &k, json!({ "label": "Omega" })).await;
    assert_eq!(out.session.label.as_deref(), Some("Omega"));
    assert_eq!(settings(&out.session), json!({ "pinned": false }));
    assert!(search(store, "zeta").await.is_empty());
    assert_eq!(search(store, "omega").await.len(), 1);

    // null clears it.
    let out = patch(store, &k, json!({ "label": null })).await;
    assert_eq!(out.session.label, None);
    assert!(search(store, "omega").await.is_empty());
    assert_eq!(store.get_session(&k).await.unwrap().unwrap().label, None);

    // Anything else is refused, and the rest of that patch is not applied.
    let err = store
        .patch_session(patch_req(&k, json!({ "label": 7, "pinned": true }), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(err.to_string().contains("label"), "{err}");
    assert_eq!(stored_settings(store, &k).await, json!({ "pinned": false }));
}

pub async fn settings_patch_must_be_an_object(store: &dyn SessionStore) {
    let k = key("settings-shape");
    acquire(store, &k, "run").await;
    patch(store, &k, json!({ "kept": 1 })).await;
    let before = store.get_session(&k).await.unwrap().unwrap();
    for bad in [
        "[1, 2]",
        "\"archived\"",
        "null",
        "42",
        "true",
        "",
        "{not json",
    ] {
        let err = store
            .patch_session(PatchSession {
                key: k.clone(),
                patch_json: bad.to_owned(),
                create: true,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{bad:?}: {err:?}");
        assert!(err.to_string().contains("patch_json"), "{bad:?}: {err}");
    }
    let after = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(after, before, "a refused patch changes nothing");
    // Nor does it create a session.
    let err = store
        .patch_session(PatchSession {
            key: key("settings-shape-new"),
            patch_json: "[]".into(),
            create: true,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(
        store
            .get_session(&key("settings-shape-new"))
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn settings_patch_creates_or_refuses(store: &dyn SessionStore) {
    let k = key("settings-new");
    let err = store
        .patch_session(patch_req(&k, json!({ "archived": true }), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(err.to_string().contains("no such session"), "{err}");
    assert!(store.get_session(&k).await.unwrap().is_none());

    let made = store
        .patch_session(patch_req(
            &k,
            json!({ "displayName": "Notes", "label": "My notes" }),
            true,
        ))
        .await
        .unwrap();
    assert!(made.created);
    let session = &made.session;
    assert_eq!(session.key, k);
    assert_eq!(session.entry_count, 0);
    assert_eq!(session.active_writer_run_id, None);
    assert_eq!(session.last_run_id, None);
    assert_eq!(session.label.as_deref(), Some("My notes"));
    assert_eq!(settings(session), json!({ "displayName": "Notes" }));
    assert!(session.created_at_ms > 0);
    assert_eq!(store.get_session(&k).await.unwrap().as_ref(), Some(session));
    assert_eq!(search(store, "my notes").await.len(), 1, "listed");

    // Once it exists, create changes nothing about creation.
    let again = store
        .patch_session(patch_req(&k, json!({ "unread": 3 }), true))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.session.session_id, session.session_id);
    assert_eq!(
        settings(&again.session),
        json!({ "displayName": "Notes", "unread": 3 })
    );

    // A first AcquireWriter finds the session the patch created.
    let held = acquire(store, &k, "run").await;
    assert!(!held.session_created);
    assert_eq!(held.session.session_id, session.session_id);
    assert_eq!(settings(&held.session)["unread"], 3);
    assert_eq!(held.session.label.as_deref(), Some("My notes"));
}

pub async fn settings_survive_reset_not_delete(store: &dyn SessionStore) {
    let k = key("settings-reset");
    let held = acquire(store, &k, "run").await;
    store
        .append(append_req(&k, &held, "run", &["a"]))
        .await
        .unwrap();
    patch(
        store,
        &k,
        json!({ "label": "Kept", "queueMode": "steer", "model": "m" }),
    )
    .await;

    let reset = store.reset_session(&k).await.unwrap();
    assert_ne!(reset.session.session_id, held.session.session_id);
    assert_eq!(reset.session.entry_count, 0);
    assert_eq!(
        settings(&reset.session),
        json!({ "queueMode": "steer", "model": "m" }),
        "a reset keeps the settings"
    );
    assert_eq!(reset.session.label.as_deref(), Some("Kept"));
    assert_eq!(
        stored_settings(store, &k).await,
        json!({ "queueMode": "steer", "model": "m" })
    );

    let deleted = store.delete_session(&k, true).await.unwrap();
    assert!(deleted.deleted);
    assert!(store.get_session(&k).await.unwrap().is_none());
    let err = store
        .patch_session(patch_req(&k, json!({ "model": "x" }), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "a deleted session: {err:?}");
    // The key's next session starts without the old settings.
    let recreated = acquire(store, &k, "run-2").await;
    assert!(recreated.session_created);
    assert_eq!(recreated.session.settings_json, "{}");
    assert_eq!(recreated.session.label, None);
    // And a patch may create after a delete, fresh as well.
    store.delete_session(&k, true).await.unwrap();
    let made = store
        .patch_session(patch_req(&k, json!({ "fresh": true }), true))
        .await
        .unwrap();
    assert!(made.created);
    assert_eq!(settings(&made.session), json!({ "fresh": true }));
    assert!(made.session.fence_token >= recreated.fence_token);
}

pub async fn settings_size_limit(store: &dyn SessionStore) {
    let k = key("settings-size");
    acquire(store, &k, "run").await;
    // `{"big":"…"}` is 10 bytes around the value.
    let at_limit = "x".repeat(DEFAULT_MAX_SETTINGS_BYTES - 10);
    let out = patch(store, &k, json!({ "big": at_limit })).await;
    assert_eq!(out.session.settings_json.len(), DEFAULT_MAX_SETTINGS_BYTES);

    // One more setting is over; nothing changes.
    let err = store
        .patch_session(patch_req(&k, json!({ "a": 1 }), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&DEFAULT_MAX_SETTINGS_BYTES.to_string()) && message.contains("bytes"),
        "{message}"
    );
    assert_eq!(
        store
            .get_session(&k)
            .await
            .unwrap()
            .unwrap()
            .settings_json
            .len(),
        DEFAULT_MAX_SETTINGS_BYTES
    );
    // Replacing the big value with a smaller one in the same patch fits.
    let out = patch(store, &k, json!({ "big": "small", "a": 1 })).await;
    assert_eq!(settings(&out.session), json!({ "a": 1, "big": "small" }));

    // A single value over the limit, also when creating: nothing is created.
    let over = "y".repeat(DEFAULT_MAX_SETTINGS_BYTES);
    let err = store
        .patch_session(patch_req(&k, json!({ "big": over }), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    let other = key("settings-size-new");
    let err = store
        .patch_session(patch_req(&other, json!({ "big": over }), true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(store.get_session(&other).await.unwrap().is_none());
    // The label does not count against the settings.
    let out = patch(store, &k, json!({ "big": null, "label": "l".repeat(500) })).await;
    assert_eq!(settings(&out.session), json!({ "a": 1 }));
}

/// Settings need no owner token: once a coordinator owns the session's
/// partition, its writes need its token, a patch does not (the edge has none).
pub async fn settings_patch_needs_no_owner_token(store: &dyn SessionStore) {
    let k = key("settings-owned");
    store
        .acquire_leases(AcquireLeases {
            member: "coordinator-a".into(),
            address: "http://coordinator-a:50062".into(),
            partitions: vec![],
            ttl_ms: 60_000,
            steal: false,
        })
        .await
        .unwrap();
    let err = store
        .acquire_writer(super::acquire_req(&k, "run", None, AcquireMode::Cas))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "STALE_OWNER", "the partition is owned");
    let made = store
        .patch_session(patch_req(&k, json!({ "archived": true }), true))
        .await
        .unwrap();
    assert!(made.created);
    assert_eq!(made.session.fence_token, 0, "no fence was issued");
    let out = patch(store, &k, json!({ "archived": false })).await;
    assert_eq!(settings(&out.session), json!({ "archived": false }));
}

const TASKS: usize = 8;
const PATCHES_PER_TASK: usize = 12;

/// Tasks patching different keys of one session at once, the first ones
/// creating it: every patch lands (no lost update), exactly one creates.
pub async fn concurrent_settings_patches_all_land(store: Arc<dyn SessionStore>) {
    let k = key("settings-race");
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for n in 0..PATCHES_PER_TASK {
                    let name = format!("t{task}-{n}");
                    let req = patch_req(&k, json!({ name: n, "last": task }), true);
                    outcomes.push(store.patch_session(req).await.expect("patch"));
                }
                outcomes
            })
        })
        .collect();
    let mut created = 0;
    let mut session_ids = std::collections::BTreeSet::new();
    for task in tasks {
        for outcome in task.await.unwrap() {
            created += usize::from(outcome.created);
            session_ids.insert(outcome.session.session_id);
        }
    }
    assert_eq!(created, 1, "exactly one patch created the session");
    assert_eq!(session_ids.len(), 1, "every patch saw the same session");
    let stored = stored_settings(&*store, &k).await;
    let stored = stored.as_object().unwrap();
    for task in 0..TASKS {
        for n in 0..PATCHES_PER_TASK {
            assert_eq!(
                stored.get(&format!("t{task}-{n}")),
                Some(&json!(n)),
                "patch {n} of task {task} was lost: {stored:?}"
            );
        }
    }
    assert_eq!(stored.len(), TASKS * PATCHES_PER_TASK + 1);
    assert!(stored["last"].as_u64().unwrap() < TASKS as u64);

    // Removals race with additions as well.
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move {
                for n in 0..PATCHES_PER_TASK {
                    let patch = json!({ format!("t{task}-{n}"): null, format!("u{task}"): n });
                    store
                        .patch_session(patch_req(&k, patch, false))
                        .await
                        .expect("patch");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut expected = serde_json::Map::new();
    expected.insert("last".into(), stored["last"].clone());
    for task in 0..TASKS {
        expected.insert(format!("u{task}"), json!(PATCHES_PER_TASK - 1));
    }
    assert_eq!(stored_settings(&*store, &k).await, Value::Object(expected));
}

/// CreateRun with `expected_settings`: created only while the session has
/// those settings; a refusal writes nothing; an existing record answers
/// whatever the settings.
pub async fn create_run_checks_the_settings_it_was_made_from(store: &dyn SessionStore) {
    let k = key("settings-admission");
    let made_from = |run_id: &str, digest| NewRun {
        expected_settings: Some(digest),
        ..super::new_run(run_id, &k, "fp")
    };
    let none_yet = store
        .create_run(made_from("a-0", settings_digest("{}")))
        .await;
    assert!(
        matches!(none_yet, Err(StoreError::SettingsChanged(_))),
        "no session, no settings to match: {none_yet:?}"
    );
    assert!(
        store.get_run("a-0").await.unwrap().is_none(),
        "nothing written"
    );

    let created = store
        .patch_session(patch_req(&k, json!({}), true))
        .await
        .unwrap();
    let read = settings_digest(&created.session.settings_json);
    let admitted = store.create_run(made_from("a-1", read)).await.unwrap();
    assert!(admitted.created);

    patch(store, &k, json!({ "model": "gpt-5" })).await;
    let stale = store.create_run(made_from("a-2", read)).await;
    assert!(
        matches!(stale, Err(StoreError::SettingsChanged(_))),
        "the settings changed after they were read: {stale:?}"
    );
    assert!(
        store.get_run("a-2").await.unwrap().is_none(),
        "nothing written"
    );
    let now = settings_digest(&store.get_session(&k).await.unwrap().unwrap().settings_json);
    assert_ne!(now, read);
    assert!(
        store
            .create_run(made_from("a-2", now))
            .await
            .unwrap()
            .created
    );

    // A retry of an admitted run is answered from its record.
    let retried = store.create_run(made_from("a-1", read)).await.unwrap();
    assert!(!retried.created && !retried.fingerprint_mismatch);
    // Without an expectation nothing is checked.
    assert!(
        store
            .create_run(super::new_run("a-3", &k, "fp"))
            .await
            .unwrap()
            .created
    );

    store.delete_session(&k, true).await.unwrap();
    let gone = store.create_run(made_from("a-4", now)).await;
    assert!(
        matches!(gone, Err(StoreError::SettingsChanged(_))),
        "the session is gone: {gone:?}"
    );
}

/// CreateRun with `create_session`: a key with no session gets one (empty
/// settings, a session id) in the run's own write; one that has a row is
/// left as it is and checked like any other; a refusal creates nothing.
pub async fn create_run_creates_a_new_session_in_the_same_write(store: &dyn SessionStore) {
    let k = key("settings-create");
    let empty = settings_digest(EMPTY_SETTINGS);
    let first = |run_id: &str| NewRun {
        expected_settings: Some(empty),
        create_session: true,
        ..super::new_run(run_id, &k, "fp")
    };
    assert!(store.get_session(&k).await.unwrap().is_none());
    let admitted = store.create_run(first("c-1")).await.unwrap();
    assert!(admitted.created);
    let session = store
        .get_session(&k)
        .await
        .unwrap()
        .expect("the session exists once its first run does");
    assert_eq!(session.settings_json, EMPTY_SETTINGS);

    // A second first send (another edge, the same moment) finds the row and
    // leaves it as it is.
    assert!(store.create_run(first("c-2")).await.unwrap().created);
    let again = store.get_session(&k).await.unwrap().unwrap();
    assert_eq!(again.session_id, session.session_id);

    // Created meanwhile with other settings: refused, nothing written.
    let other = key("settings-create-other");
    store
        .patch_session(patch_req(&other, json!({ "model": "gpt-5" }), true))
        .await
        .unwrap();
    let stale = store
        .create_run(NewRun {
            expected_settings: Some(empty),
            create_session: true,
            ..super::new_run("c-3", &other, "fp")
        })
        .await;
    assert!(
        matches!(stale, Err(StoreError::SettingsChanged(_))),
        "the session was created with other settings: {stale:?}"
    );
    assert!(store.get_run("c-3").await.unwrap().is_none());

    // A refusal of a new session's first run creates no session either.
    let unowned = key("settings-create-refused");
    let refused = store
        .create_run(NewRun {
            expected_settings: Some(empty.wrapping_add(1)),
            create_session: true,
            ..super::new_run("c-4", &unowned, "fp")
        })
        .await;
    assert!(matches!(refused, Err(StoreError::SettingsChanged(_))));
    assert!(store.get_session(&unowned).await.unwrap().is_none());
    assert!(store.get_run("c-4").await.unwrap().is_none());
}

//! The service through its gRPC face: the conformance suite via the remote
//! client for every backend, health and reflection, and bad input.

mod suite;

use std::sync::Arc;

use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use session_store::backend::memory::MemoryStore;
use session_store::limits::Limits;
use session_store::server::ServeOptions;
use suite::harness::TestServer;
use tonic::Code;

mod memory {
    crate::conformance_cases!(crate::suite::harness::grpc_memory);
}

mod embedded {
    crate::conformance_cases!(crate::suite::harness::grpc_embedded);
}

mod postgres {
    crate::conformance_cases!(crate::suite::harness::grpc_postgres);
}

async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

const SERVICE: &str = "clawgate.session_store.v1.SessionStore";

#[tokio::test]
async fn health_answers_serving() {
    let server = TestServer::start(Arc::new(MemoryStore::new()), ServeOptions::default()).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&server).await);
    for service in [SERVICE, ""] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    server.stop().await;
}

/// Both reflection versions list exactly what this server serves (not the
/// coordinator or the runtime, whose descriptors share the set).
#[tokio::test]
async fn reflection_lists_exactly_the_served_services() {
    let server = TestServer::start(Arc::new(MemoryStore::new()), ServeOptions::default()).await;
    clawgate_system_tests::reflection::assert_lists_exactly(&server.url(), &[SERVICE]).await;
    server.stop().await;
}

fn small_limits() -> ServeOptions {
    ServeOptions {
        limits: Limits {
            max_entry_bytes: 1024,
            max_entries_per_append: 4,
            max_append_bytes: 2048,
            ..Limits::default()
        },
        ..ServeOptions::default()
    }
}

fn entry(content_json: &str) -> pb::NewEntry {
    pb::NewEntry {
        role: "user".into(),
        content_json: content_json.into(),
        ..Default::default()
    }
}

async fn expect_invalid<T: std::fmt::Debug>(
    what: &str,
    result: Result<tonic::Response<T>, tonic::Status>,
    message_part: &str,
) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    assert!(
        status.message().contains(message_part),
        "{what}: {:?} lacks {message_part:?}",
        status.message()
    );
    let err = session_store::grpc::status::from_status(status);
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{what}");
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_writes_nothing() {
    let backend = Arc::new(MemoryStore::new());
    let server = TestServer::start(backend.clone(), small_limits()).await;
    let mut client = SessionStoreClient::connect(server.url()).await.unwrap();

    let acquire = |key: &str, run: &str| pb::AcquireWriterRequest {
        session_key: key.into(),
        run_id: run.into(),
        ..Default::default()
    };
    let mut bad_expected = acquire("main", "r");
    bad_expected.expected_session_id = "not-a-uuid".into();
    let mut nul_label = acquire("main", "r");
    nul_label.label = Some("a\0b".into());
    let mut bad_mode = acquire("main", "r");
    bad_mode.mode = 99;
    for (what, request, message_part) in [
        ("empty key", acquire("", "r"), "must not be empty"),
        ("long key", acquire(&"k".repeat(513), "r"), "maximum is 512"),
        (
            "malformed agent key",
            acquire("agent:main", "r"),
            "malformed sessionKey",
        ),
        ("empty run id", acquire("main", ""), "runId"),
        ("bad expected uuid", bad_expected, "not a UUID"),
        ("NUL in label", nul_label, "NUL characters"),
        ("bad mode", bad_mode, "acquire mode"),
    ] {
        expect_invalid(what, client.acquire_writer(request).await, message_part).await;
    }
    let nothing = client
        .get_session(pb::GetSessionRequest {
            session_key: "main".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        nothing.session.is_none(),
        "no session was created by bad input"
    );

    // A real writer, then bad appends.
    let held = client
        .acquire_writer(acquire("main", "run"))
        .await
        .unwrap()
        .into_inner();
    let session_id = held.session.unwrap().session_id;
    let append = |session_id: &str, entries: Vec<pb::NewEntry>| pb::AppendRequest {
        owner_token: None,
        session_key: "main".into(),
        session_id: session_id.into(),
        run_id: "run".into(),
        fence_token: held.fence_token,
        entries,
    };
    expect_invalid(
        "bad session uuid",
        client.append(append("zzz", vec![entry("[]")])).await,
        "not a UUID",
    )
    .await;
    expect_invalid(
        "no entries",
        client.append(append(&session_id, vec![])).await,
        "at least one",
    )
    .await;
    expect_invalid(
        "oversized entry",
        client
            .append(append(
                &session_id,
                vec![entry(&format!("\"{}\"", "x".repeat(2000)))],
            ))
            .await,
        "the maximum is 1024",
    )
    .await;
    expect_invalid(
        "too many entries",
        client
            .append(append(&session_id, vec![entry("[]"); 5]))
            .await,
        "maximum is 4",
    )
    .await;
    let medium = entry(&format!("\"{}\"", "x".repeat(900)));
    expect_invalid(
        "oversized append",
        client.append(append(&session_id, vec![medium; 3])).await,
        "maximum is 2048",
    )
    .await;
    expect_invalid(
        "content not JSON",
        client
            .append(append(&session_id, vec![entry("{nope")]))
            .await,
        "not valid JSON",
    )
    .await;
    let mut bad_role = entry("[]");
    bad_role.role = String::new();
    expect_invalid(
        "empty role",
        client.append(append(&session_id, vec![bad_role])).await,
        "role",
    )
    .await;

    let history = |limit, max_chars| pb::HistoryRequest {
        session_key: "main".into(),
        limit,
        max_chars,
        ..Default::default()
    };
    expect_invalid(
        "history limit",
        client.history(history(1001, None)).await,
        "limit must be 1..=1000",
    )
    .await;
    expect_invalid(
        "max chars 0",
        client.history(history(10, Some(0))).await,
        "maxChars",
    )
    .await;
    expect_invalid(
        "both cursors",
        client
            .history(pb::HistoryRequest {
                session_key: "main".into(),
                before_seq: Some(3),
                after_seq: Some(1),
                ..Default::default()
            })
            .await,
        "at most one",
    )
    .await;
    expect_invalid(
        "list limit",
        client
            .list_sessions(pb::ListSessionsRequest {
                limit: 5000,
                ..Default::default()
            })
            .await,
        "limit must be",
    )
    .await;
    expect_invalid(
        "active minutes 0",
        client
            .list_sessions(pb::ListSessionsRequest {
                active_minutes: Some(0),
                ..Default::default()
            })
            .await,
        "active_minutes",
    )
    .await;
    expect_invalid(
        "run created terminal",
        client
            .create_run(pb::CreateRunRequest {
                run_id: "r1".into(),
                session_key: "main".into(),
                kind: "agent".into(),
                status: pb::RunStatus::Ok as i32,
                ..Default::default()
            })
            .await,
        "accepted or queued",
    )
    .await;
    expect_invalid(
        "run without kind",
        client
            .create_run(pb::CreateRunRequest {
                run_id: "r1".into(),
                session_key: "main".into(),
                ..Default::default()
            })
            .await,
        "kind must not be empty",
    )
    .await;

    // Nothing was written by any of it.
    let page = client
        .history(history(10, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.total, 0);
    let run = client
        .get_run(pb::GetRunRequest {
            run_id: "r1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(run.record.is_none());
    server.stop().await;
}

#[tokio::test]
async fn fence_errors_carry_code_and_current_values() {
    let server = TestServer::start(Arc::new(MemoryStore::new()), ServeOptions::default()).await;
    let mut client = SessionStoreClient::connect(server.url()).await.unwrap();
    let first = client
        .acquire_writer(pb::AcquireWriterRequest {
            session_key: "main".into(),
            run_id: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let status = client
        .acquire_writer(pb::AcquireWriterRequest {
            session_key: "main".into(),
            run_id: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    let err = session_store::grpc::status::from_status(status);
    assert_eq!(err.code(), "WRITER_CONFLICT");
    assert_eq!(
        err.current_session().unwrap().fence_token,
        first.fence_token
    );
    let status = client
        .append(pb::AppendRequest {
            owner_token: None,
            session_key: "main".into(),
            session_id: first.session.unwrap().session_id,
            run_id: "b".into(),
            fence_token: first.fence_token,
            entries: vec![entry("[]")],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let err = session_store::grpc::status::from_status(status);
    assert_eq!(err.code(), "STALE_WRITER");
    assert_eq!(
        err.current_session()
            .unwrap()
            .active_writer_run_id
            .as_deref(),
        Some("a")
    );
    server.stop().await;
}

/// The trailers of one status: its message percent-encoded and its
/// encoded details, roughly as they go on the wire.
fn trailer_bytes(status: &tonic::Status) -> usize {
    let encoded: usize = status
        .message()
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { 1 } else { 3 })
        .sum();
    encoded + status.details().len() * 4 / 3
}

#[tokio::test]
async fn refusals_quoting_large_input_or_records_stay_within_the_trailer_budget() {
    use session_store::SessionStore;
    use session_store::model::{NewRun, RunStatus, RunUpdate};

    let server = TestServer::start(Arc::new(MemoryStore::new()), ServeOptions::default()).await;
    let mut client = SessionStoreClient::new(channel(&server).await);
    // A bogus sessionId of 64 KiB is quoted by its start only.
    let refused = client
        .append(pb::AppendRequest {
            owner_token: None,
            session_key: "main".into(),
            session_id: "😀".repeat(16 * 1024),
            run_id: "r".into(),
            fence_token: 1,
            entries: vec![entry("[]")],
        })
        .await
        .expect_err("not a UUID");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().len() <= 600,
        "{}",
        refused.message().len()
    );
    assert!(trailer_bytes(&refused) < 12 * 1024);

    // A finished run whose request and outcome are 64 KiB each.
    let remote = server.remote().await;
    let big = "x".repeat(64 * 1024);
    let created = remote
        .create_run(NewRun {
            owner_token: None,
            run_id: "big".into(),
            session_key: session_store::SessionKey::parse("main").unwrap(),
            kind: "agent".into(),
            fingerprint: "f".into(),
            status: RunStatus::Accepted,
            owner: "o".into(),
            request_json: serde_json::json!({ "m": big }).to_string(),
            expected_settings: None,
            create_session: false,
        })
        .await
        .unwrap();
    let update = |version, outcome_json: Option<String>| RunUpdate {
        owner_token: None,
        run_id: "big".into(),
        expected_version: version,
        status: RunStatus::Ok,
        owner: None,
        outcome_json,
        session_id: None,
        fence_token: None,
    };
    let done = remote
        .update_run(update(
            created.record.version,
            Some(serde_json::json!({ "t": big }).to_string()),
        ))
        .await
        .unwrap();
    // Refused: the status carries the record without its payloads, marked so.
    let refused = client
        .update_run(pb::UpdateRunRequest {
            run_id: "big".into(),
            expected_version: done.version,
            status: pb::RunStatus::Ok as i32,
            ..Default::default()
        })
        .await
        .expect_err("terminal");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(trailer_bytes(&refused) < 12 * 1024);
    assert!(session_store::grpc::status::is_trimmed(&refused));
    // … and the remote client reads it whole, as the in-process store has it.
    match remote.update_run(update(done.version, None)).await {
        Err(session_store::StoreError::RunTerminal { current }) => assert_eq!(*current, done),
        other => panic!("expected RUN_TERMINAL, got {other:?}"),
    }
    match remote.update_run(update(1, None)).await {
        Err(session_store::StoreError::RunTerminal { current }) => assert_eq!(*current, done),
        other => panic!("expected RUN_TERMINAL, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn patch_session_over_the_wire() {
    let backend = MemoryStore::new().with_max_settings_bytes(64);
    let server = TestServer::start(Arc::new(backend), ServeOptions::default()).await;
    let mut client = SessionStoreClient::new(channel(&server).await);
    let patch = |key: &str, patch_json: &str, create| pb::PatchSessionRequest {
        session_key: key.into(),
        patch_json: patch_json.into(),
        create,
    };
    let made = client
        .patch_session(patch("main", r#"{"archived":true,"label":"L"}"#, true))
        .await
        .unwrap()
        .into_inner();
    assert!(made.created);
    let session = made.session.unwrap();
    assert_eq!(session.session_key, "agent:main:main");
    assert_eq!(session.settings_json, r#"{"archived":true}"#);
    assert_eq!(session.label.as_deref(), Some("L"));
    let got = client
        .get_session(pb::GetSessionRequest {
            session_key: "main".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.session.unwrap().settings_json, r#"{"archived":true}"#);

    let long_label = serde_json::json!({ "label": "l".repeat(513) }).to_string();
    for (what, request, message_part) in [
        ("an array", patch("main", "[]", true), "JSON object"),
        ("not JSON", patch("main", "{", true), "not valid JSON"),
        (
            "bad key",
            patch("agent:main", "{}", true),
            "malformed sessionKey",
        ),
        (
            "a number label",
            patch("main", r#"{"label":1}"#, false),
            "label",
        ),
        (
            "long label",
            patch("main", &long_label, false),
            "label is longer",
        ),
        (
            "NUL label",
            patch("main", r#"{"label":"a\u0000b"}"#, false),
            "NUL",
        ),
        (
            "unknown session",
            patch("other", "{}", false),
            "no such session",
        ),
        (
            "over the backend's limit",
            patch(
                "main",
                &serde_json::json!({ "x": "y".repeat(64) }).to_string(),
                false,
            ),
            "the maximum is 64",
        ),
    ] {
        expect_invalid(what, client.patch_session(request).await, message_part).await;
    }
    let got = client
        .get_session(pb::GetSessionRequest {
            session_key: "main".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(got.settings_json, r#"{"archived":true}"#, "nothing changed");
    assert_eq!(got.label.as_deref(), Some("L"));
    server.stop().await;
}

/// A fence refusal carries the current session; with settings at their
/// limit it still fits the trailers: the settings are left out, marked so.
#[tokio::test]
async fn a_refusal_with_large_settings_stays_within_the_trailer_budget() {
    use session_store::SessionStore;
    use session_store::model::PatchSession;

    let server = TestServer::start(Arc::new(MemoryStore::new()), ServeOptions::default()).await;
    let mut client = SessionStoreClient::new(channel(&server).await);
    let remote = server.remote().await;
    let key = session_store::SessionKey::parse("main").unwrap();
    let held = client
        .acquire_writer(pb::AcquireWriterRequest {
            session_key: "main".into(),
            run_id: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let big = "😀".repeat(4000);
    remote
        .patch_session(PatchSession {
            key: key.clone(),
            patch_json: serde_json::json!({ "big": big }).to_string(),
            create: false,
        })
        .await
        .unwrap();
    let refused = client
        .acquire_writer(pb::AcquireWriterRequest {
            session_key: "main".into(),
            run_id: "b".into(),
            ..Default::default()
        })
        .await
        .expect_err("the slot is held");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert!(trailer_bytes(&refused) < 12 * 1024);
    assert!(session_store::grpc::status::is_trimmed(&refused));
    let err = session_store::grpc::status::from_status(refused);
    let current = err.current_session().expect("the current session travels");
    assert_eq!(current.fence_token, held.fence_token);
    assert_eq!(current.settings_json, "{}", "left out");
    // GetSession reads it whole.
    let whole = remote.get_session(&key).await.unwrap().unwrap();
    let settings: serde_json::Value = serde_json::from_str(&whole.settings_json).unwrap();
    assert_eq!(settings["big"], big);
    server.stop().await;
}

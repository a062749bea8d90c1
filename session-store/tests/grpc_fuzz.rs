//! No client input may panic or wedge the store (issue 9): every method of
//! `SessionStore`, as the descriptor set lists it, gets generated requests
//! with random and edge values in every field (`clawgate_system_tests::
//! proto_fuzz`), against a real backend behind the real gRPC server in this
//! process. Each answer must be OK or a clean refusal, no thread may panic,
//! and afterwards the health check and a valid read must still succeed.
//!
//! The store is seeded with a session holding a writer and a few entries and
//! with run records, and their ids, keys and the session's id are in the
//! generator's dictionary, so generated calls reach past "not found".

mod suite;

use std::time::{Duration, Instant};

use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_system_tests::proto_fuzz::{CallLimits, Fuzz, Report, Seeds};
use session_store::SessionStore;
use session_store::key::SessionKey;
use session_store::model::{
    AcquireMode, AcquireWriter, AppendEntries, EntryMetadata, ExpectedSession, NewEntry, NewRun,
    RunStatus, RunUpdate,
};
use session_store::server::ServeOptions;
use suite::harness::TestServer;
use tonic::transport::Channel;

const SERVICE: &str = "clawgate.session_store.v1.SessionStore";
const SEED: u64 = 0x5e55_1014_f022_2026;
const KEY: &str = "agent:main:fuzz";
const WRITER: &str = "fuzz-writer";
const RUN: &str = "fuzz-run";
const BIG_RUN: &str = "fuzz-big-run";
/// A second session, for the seeds that reset or delete.
const OTHER_KEY: &str = "agent:main:fuzz-other";

/// What the seeding created: the session's id and the writer's fence.
struct Seeded {
    dictionary: Vec<String>,
    session_id: String,
    fence: u64,
}

/// A valid request for every method, naming what `seed` created.
fn seeds(seeded: &Seeded) -> Seeds {
    let path = |method: &str| format!("/{SERVICE}/{method}");
    let entry = pb::NewEntry {
        role: "assistant".into(),
        content_json: r#"[{"type":"text","text":"four"}]"#.into(),
        timestamp_ms: 0,
        metadata: Some(pb::EntryMetadata {
            stop_reason: Some("stop".into()),
            usage_json: Some(r#"{"input_tokens":1}"#.into()),
            aborted: false,
        }),
    };
    Seeds::default()
        .with(
            &path("AcquireWriter"),
            &pb::AcquireWriterRequest {
                owner_token: None,
                session_key: KEY.into(),
                expected_session_id: seeded.session_id.clone(),
                expected_writer_run_id: Some(WRITER.into()),
                run_id: WRITER.into(),
                mode: pb::AcquireMode::Cas as i32,
                label: None,
            },
        )
        .with(
            &path("ReleaseWriter"),
            &pb::ReleaseWriterRequest {
                owner_token: None,
                session_key: KEY.into(),
                run_id: WRITER.into(),
                fence_token: seeded.fence,
            },
        )
        .with(
            &path("Append"),
            &pb::AppendRequest {
                owner_token: None,
                session_key: KEY.into(),
                session_id: seeded.session_id.clone(),
                run_id: WRITER.into(),
                fence_token: seeded.fence,
                entries: vec![entry],
            },
        )
        .with(
            &path("History"),
            &pb::HistoryRequest {
                session_key: KEY.into(),
                limit: 2,
                after_seq: Some(1),
                max_chars: Some(100),
                session_id: Some(seeded.session_id.clone()),
                ..Default::default()
            },
        )
        .with(
            &path("GetSession"),
            &pb::GetSessionRequest {
                session_key: KEY.into(),
            },
        )
        .with(
            &path("ListSessions"),
            &pb::ListSessionsRequest {
                limit: 10,
                active_minutes: Some(60),
                search: Some("fuzz".into()),
                updated_since_ms: Some(0),
            },
        )
        .with(
            &path("ResetSession"),
            &pb::ResetSessionRequest {
                session_key: OTHER_KEY.into(),
            },
        )
        .with(
            &path("DeleteSession"),
            &pb::DeleteSessionRequest {
                session_key: OTHER_KEY.into(),
                delete_transcript: true,
            },
        )
        .with(
            &path("PatchSession"),
            &pb::PatchSessionRequest {
                session_key: KEY.into(),
                patch_json: r#"{"archived":true,"label":"fuzz label","model":null}"#.into(),
                create: false,
            },
        )
        .with(
            &path("PatchSession"),
            &pb::PatchSessionRequest {
                session_key: OTHER_KEY.into(),
                patch_json: r#"{"unread":1}"#.into(),
                create: true,
            },
        )
        .with(
            &path("CreateRun"),
            &pb::CreateRunRequest {
                owner_token: None,
                run_id: "fuzz-new-run".into(),
                session_key: KEY.into(),
                kind: "agent".into(),
                fingerprint: "fp".into(),
                status: pb::RunStatus::Accepted as i32,
                owner: "fuzz-owner".into(),
                request_json: "{}".into(),
                expected_settings_digest: None,
                create_session: false,
            },
        )
        .with(
            &path("UpdateRun"),
            &pb::UpdateRunRequest {
                run_id: BIG_RUN.into(),
                expected_version: 2,
                status: pb::RunStatus::Ok as i32,
                outcome_json: Some("{}".into()),
                ..Default::default()
            },
        )
        .with(
            &path("UpdateRun"),
            &pb::UpdateRunRequest {
                run_id: RUN.into(),
                expected_version: 1,
                status: pb::RunStatus::Running as i32,
                owner: Some("fuzz-owner".into()),
                session_id: Some(seeded.session_id.clone()),
                fence_token: Some(seeded.fence),
                ..Default::default()
            },
        )
        .with(
            &path("GetRun"),
            &pb::GetRunRequest {
                run_id: BIG_RUN.into(),
            },
        )
        .with(
            &path("ListActiveRuns"),
            &pb::ListActiveRunsRequest {
                owner: Some("fuzz-owner".into()),
            },
        )
        .with(
            &path("PurgeExpiredRuns"),
            &pb::PurgeExpiredRunsRequest { ended_before_ms: 1 },
        )
}

/// Gives the backend a session with a writer and entries, and run records;
/// returns the strings that name them.
async fn seed(store: &dyn SessionStore) -> Seeded {
    let key = SessionKey::parse(KEY).unwrap();
    let held = store
        .acquire_writer(AcquireWriter {
            owner_token: None,
            key: key.clone(),
            expected_session: ExpectedSession::Current,
            expected_writer: None,
            run_id: WRITER.into(),
            mode: AcquireMode::Cas,
            label: Some("fuzz label".into()),
        })
        .await
        .unwrap();
    let entry = |text: &str| NewEntry {
        role: "user".into(),
        content_json: serde_json::json!([{ "type": "text", "text": text }]).to_string(),
        timestamp_ms: None,
        metadata: EntryMetadata::default(),
    };
    store
        .append(AppendEntries {
            owner_token: None,
            key,
            session_id: held.session.session_id,
            run_id: WRITER.into(),
            fence_token: held.fence_token,
            entries: vec![entry("one"), entry("two"), entry("three")],
        })
        .await
        .unwrap();
    for (run_id, status) in [(RUN, RunStatus::Accepted), (WRITER, RunStatus::Queued)] {
        store
            .create_run(NewRun {
                owner_token: None,
                run_id: run_id.into(),
                session_key: SessionKey::parse(KEY).unwrap(),
                kind: "agent".into(),
                fingerprint: "fp".into(),
                status,
                owner: "fuzz-owner".into(),
                request_json: "{}".into(),
                expected_settings: None,
                create_session: false,
            })
            .await
            .unwrap();
    }
    // A finished run with large payloads (a long request, a long answer):
    // a refusal of an update to it carries the record back.
    let big = store
        .create_run(NewRun {
            owner_token: None,
            run_id: BIG_RUN.into(),
            session_key: SessionKey::parse(KEY).unwrap(),
            kind: "agent".into(),
            fingerprint: "fp".into(),
            status: RunStatus::Accepted,
            owner: "fuzz-owner".into(),
            request_json: serde_json::json!({ "message": "m".repeat(64 * 1024) }).to_string(),
            expected_settings: None,
            create_session: false,
        })
        .await
        .unwrap();
    store
        .update_run(RunUpdate {
            owner_token: None,
            run_id: BIG_RUN.into(),
            expected_version: big.record.version,
            status: RunStatus::Ok,
            owner: None,
            outcome_json: Some(serde_json::json!({ "text": "t".repeat(64 * 1024) }).to_string()),
            session_id: None,
            fence_token: None,
        })
        .await
        .unwrap();
    let dictionary = vec![
        KEY.into(),
        OTHER_KEY.into(),
        BIG_RUN.into(),
        "fuzz".into(),
        WRITER.into(),
        RUN.into(),
        "fp".into(),
        "fuzz-owner".into(),
        "agent".into(),
        held.session.session_id.to_string(),
    ];
    Seeded {
        dictionary,
        session_id: held.session.session_id.to_string(),
        fence: held.fence_token,
    }
}

/// A valid read the store must still answer after every case.
fn probe(channel: Channel) -> futures::future::BoxFuture<'static, Result<(), String>> {
    Box::pin(async move {
        let mut client = SessionStoreClient::new(channel);
        let session = client
            .get_session(pb::GetSessionRequest {
                session_key: KEY.into(),
            })
            .await
            .map_err(|s| format!("GetSession: {s:?}"))?
            .into_inner()
            .session;
        if session.is_none() {
            // A generated DeleteSession may remove it: the key still reads.
            client
                .history(pb::HistoryRequest {
                    session_key: KEY.into(),
                    ..Default::default()
                })
                .await
                .map_err(|s| format!("History: {s:?}"))?;
        }
        Ok(())
    })
}

/// Fuzzes the service over the backend `open` makes; returns the report.
fn fuzz(
    runtime: &tokio::runtime::Runtime,
    cases: u32,
    open: impl AsyncFnOnce() -> suite::harness::Harness,
) -> Report {
    let (harness, server, seeded) = runtime.block_on(async {
        let harness = open().await;
        let seeded = seed(harness.store()).await;
        let server = TestServer::start(harness.shared(), ServeOptions::default()).await;
        (harness, server, seeded)
    });
    let channel = runtime.block_on(async {
        tonic::transport::Endpoint::from_shared(server.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let report = Fuzz {
        runtime,
        channel,
        service: SERVICE,
        health: SERVICE,
        seeds: seeds(&seeded),
        dictionary: seeded.dictionary,
        cases,
        seed: SEED,
        limits: CallLimits {
            deadline: Duration::from_secs(5),
            ..CallLimits::default()
        },
    }
    .run(&probe);
    runtime.block_on(async {
        server.stop().await;
        harness.finish().await;
    });
    report
}

/// One test for all backends, one after another: the panic hook that
/// watches the servers is process-wide.
#[test]
fn every_method_answers_any_input_cleanly() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut report = Report::default();
    for (backend, cases, open) in [
        ("embedded", 64, BackendKind::Embedded),
        ("memory", 32, BackendKind::Memory),
        ("postgres", 16, BackendKind::Postgres),
    ] {
        let started = Instant::now();
        let one = match open {
            BackendKind::Embedded => fuzz(&runtime, cases, suite::harness::embedded),
            BackendKind::Memory => fuzz(&runtime, cases, suite::harness::memory),
            BackendKind::Postgres => fuzz(&runtime, cases, suite::harness::postgres),
        };
        eprintln!(
            "{backend}: {cases} cases per method in {:?}",
            started.elapsed()
        );
        report.merge(backend, one);
    }
    eprintln!("{report}");
    report.assert_clean();
}

enum BackendKind {
    Embedded,
    Memory,
    Postgres,
}

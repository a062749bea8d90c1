//! Least privilege between the services (docs/security.md): the three
//! real binaries, each caller kind with a token of its own
//! (`CLAWGATE_EDGE_TOKENS`, `CLAWGATE_COORDINATOR_TOKENS`,
//! `CLAWGATE_INTERNAL_TOKENS`). A chat runs end to end through the edge; an
//! internal caller submits, waits, follows and cancels through
//! run-coordinator-api's router; a token calling outside its kind's table
//! (the edge's taking leases or appending, an internal caller's reading
//! the store or listing every run, a coordinator's submitting) is refused
//! `PERMISSION_DENIED`, naming the kind and the method, and nothing is
//! written; an internal caller bound to a session prefix acts on its own
//! sessions only; every edge method that reaches the services works with
//! the edge's token; and no process prints a token.

use clawgate_proto::run_coordinator::v1 as coordinator_pb;
use clawgate_proto::session_store::v1 as store_pb;
use clawgate_system_tests::bearer::{coordinator_client, lease_grab, store_client, with_token};
use clawgate_system_tests::{Role, System};
use run_coordinator_api::model::{CancelTarget, RunSpec, SubmitRequest};
use run_coordinator_api::{Router, RouterConfig};
use serde_json::json;
use session_store::grpc::client::RemoteStore;
use session_store::key::SessionKey;
use std::time::Duration;
use tonic::Code;

const EDGE: &str = "edge-token-for-the-scoped-test";
const COORDINATOR: &str = "coordinator-token-for-the-scoped-test";
const INTERNAL: &str = "internal-token-for-the-scoped-test";
/// Bound to the sessions of agent `billing`.
const BILLING: &str = "billing-token-for-the-scoped-test";
const BILLING_PREFIX: &str = "agent:billing:";

const STORE: &str = "/clawgate.session_store.v1.SessionStore";
const RUN_COORDINATOR: &str = "/clawgate.run_coordinator.v1.RunCoordinator";

async fn start() -> System {
    let internal = format!("{INTERNAL},{BILLING_PREFIX}={BILLING}");
    // Slower runs than the default (20 pieces, 50 ms apart), so that the
    // refused cancels below are likely to meet a run still going.
    System::builder()
        .echo(20, Duration::from_millis(50))
        .env_for(Role::Store, "CLAWGATE_EDGE_TOKENS", EDGE)
        .env_for(Role::Store, "CLAWGATE_COORDINATOR_TOKENS", COORDINATOR)
        .env_for(Role::Store, "CLAWGATE_INTERNAL_TOKENS", &internal)
        .env_for(Role::Coordinator, "CLAWGATE_SERVICE_TOKEN", COORDINATOR)
        .env_for(Role::Coordinator, "CLAWGATE_EDGE_TOKENS", EDGE)
        // Known to the coordinator too (as one environment for every
        // service would have it): its table grants the kind nothing there.
        .env_for(
            Role::Coordinator,
            "CLAWGATE_COORDINATOR_TOKENS",
            COORDINATOR,
        )
        .env_for(Role::Coordinator, "CLAWGATE_INTERNAL_TOKENS", &internal)
        .env_for(Role::Edge, "CLAWGATE_SERVICE_TOKEN", EDGE)
        .start()
        .await
}

/// An internal caller's router (the real client path: the lease table
/// from the store, the calls to the session's owner), with `token`.
async fn router_with(cluster: &System, token: &str) -> Router {
    let tokens = token.parse().unwrap();
    let store = RemoteStore::connect_with(&cluster.store().url(), Some(&tokens), None)
        .await
        .unwrap();
    let mut config = RouterConfig::new(&cluster.coordinator().url()).unwrap();
    config.tokens = Some(tokens);
    Router::new(config, store).unwrap()
}

/// Asserts `refused` is PERMISSION_DENIED for the `kind` caller calling
/// `path`, naming neither token.
fn assert_denied(refused: tonic::Status, kind: &str, path: &str) {
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let says = format!("the {kind} caller may not call {path}");
    assert!(refused.message().starts_with(&says), "{refused:?}");
    for token in [EDGE, COORDINATOR, INTERNAL, BILLING] {
        assert!(!refused.message().contains(token), "{refused:?}");
    }
}

/// What the store holds of a session (read with the coordinator's token):
/// its entry count and fence, and the lease table's owners.
async fn store_state(cluster: &System, session: &str) -> (u64, u64, Vec<Option<String>>) {
    let mut store = store_client(cluster.store().url()).await;
    let get = store_pb::GetSessionRequest {
        session_key: session.into(),
    };
    let session = store
        .get_session(with_token(get, Some(COORDINATOR)))
        .await
        .unwrap()
        .into_inner()
        .session
        .expect("the session exists");
    let leases = store
        .list_leases(with_token(
            store_pb::ListLeasesRequest {},
            Some(COORDINATOR),
        ))
        .await
        .unwrap()
        .into_inner();
    let owners = leases.leases.into_iter().map(|l| l.owner).collect();
    (session.entry_count, session.fence_token, owners)
}

/// The store's record of `run_id`, read with the coordinator's token.
async fn run_record(cluster: &System, run_id: &str) -> Option<store_pb::RunRecord> {
    let mut store = store_client(cluster.store().url()).await;
    let get = store_pb::GetRunRequest {
        run_id: run_id.into(),
    };
    let answer = store.get_run(with_token(get, Some(COORDINATOR))).await;
    answer.unwrap().into_inner().record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_kind_calls_its_own_rpcs_and_nothing_else() {
    let cluster = start().await;

    // The edge's and the coordinator's tokens carry a chat end to end.
    let mut client = cluster.connect().await;
    let sent = client
        .request(
            "chat.send",
            json!({ "sessionKey": "scoped", "message": "hello", "idempotencyKey": "s-1" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}\n{}", cluster.output());
    let end = client.chat_end("s-1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let history = client
        .request("chat.history", json!({ "sessionKey": "scoped" }))
        .await;
    assert_eq!(history["ok"], true, "{history}");
    let before = store_state(&cluster, "scoped").await;
    assert!(before.0 >= 2, "the chat's entries: {before:?}");

    // The edge's token may not take leases or write a transcript.
    let mut store = store_client(cluster.store().url()).await;
    let take = lease_grab();
    let refused = store
        .acquire_leases(with_token(take.clone(), Some(EDGE)))
        .await
        .unwrap_err();
    assert_denied(refused, "edge", &format!("{STORE}/AcquireLeases"));
    let session = store
        .get_session(with_token(
            store_pb::GetSessionRequest {
                session_key: "scoped".into(),
            },
            Some(EDGE),
        ))
        .await
        .expect("the edge reads sessions")
        .into_inner()
        .session
        .unwrap();
    let append = store_pb::AppendRequest {
        session_key: "scoped".into(),
        session_id: session.session_id,
        run_id: "s-1".into(),
        fence_token: session.fence_token,
        entries: vec![store_pb::NewEntry {
            role: "assistant".into(),
            content_json: "\"forged\"".into(),
            timestamp_ms: 1,
            metadata: None,
        }],
        owner_token: None,
    };
    let refused = store
        .append(with_token(append.clone(), Some(EDGE)))
        .await
        .unwrap_err();
    assert_denied(refused, "edge", &format!("{STORE}/Append"));

    // An internal caller's token reads no session, writes nothing.
    let history = store_pb::HistoryRequest {
        session_key: "scoped".into(),
        ..Default::default()
    };
    let refused = store
        .history(with_token(history, Some(INTERNAL)))
        .await
        .unwrap_err();
    assert_denied(refused, "internal", &format!("{STORE}/History"));
    let refused = store
        .append(with_token(append, Some(INTERNAL)))
        .await
        .unwrap_err();
    assert_denied(refused, "internal", &format!("{STORE}/Append"));
    let refused = store
        .acquire_leases(with_token(take, Some(INTERNAL)))
        .await
        .unwrap_err();
    assert_denied(refused, "internal", &format!("{STORE}/AcquireLeases"));
    assert_eq!(
        store_state(&cluster, "scoped").await,
        before,
        "a refused call wrote nothing"
    );

    // An internal caller submits, waits, follows and cancels through the
    // router; it may not list every session's runs.
    let internal = router_with(&cluster, INTERNAL).await;
    let session = SessionKey::parse("reports").unwrap();
    internal
        .submit(SubmitRequest::new(
            "i-1",
            session.clone(),
            RunSpec::new("agent", "hi"),
        ))
        .await
        .expect("an internal caller submits");
    let mut events = internal.subscribe_run("i-1", 0, "").await.unwrap();
    assert!(events.next().await.unwrap().is_some(), "it follows the run");
    let waited = internal.wait("i-1", 30_000).await.unwrap();
    assert!(waited.terminal, "{waited:?}");
    internal
        .cancel(CancelTarget::Session(session), "internal-test")
        .await
        .expect("an internal caller cancels");
    let mut coordinator = coordinator_client(cluster.coordinator().url()).await;
    let list = coordinator_pb::ListActiveRequest { session_key: None };
    let refused = coordinator
        .list_active(with_token(list, Some(INTERNAL)))
        .await
        .unwrap_err();
    assert_denied(
        refused,
        "internal",
        &format!("{RUN_COORDINATOR}/ListActive"),
    );
    // The router hands the refusal to its caller as one, not as a fault.
    let refused = internal.list_active(None).await.unwrap_err();
    assert_eq!(refused.code(), "PERMISSION_DENIED", "{refused:?}");

    // The coordinator's token submits nothing to a coordinator.
    let submit = coordinator_pb::SubmitRequest {
        run_id: "c-1".into(),
        session_key: "scoped".into(),
        kind: "agent".into(),
        message: "hi".into(),
        ..Default::default()
    };
    let refused = coordinator
        .submit(with_token(submit, Some(COORDINATOR)))
        .await
        .unwrap_err();
    assert_denied(refused, "coordinator", &format!("{RUN_COORDINATOR}/Submit"));
    assert!(
        run_record(&cluster, "c-1").await.is_none(),
        "nothing admitted"
    );

    let output = cluster.output();
    for token in [EDGE, COORDINATOR, INTERNAL, BILLING] {
        assert!(
            !output.contains(token),
            "a process printed a token:\n{output}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_caller_bound_to_a_prefix_acts_on_its_sessions_only() {
    let cluster = start().await;
    let billing = router_with(&cluster, BILLING).await;
    let own = SessionKey::parse("agent:billing:invoice-7").unwrap();
    billing
        .submit(SubmitRequest::new(
            "b-1",
            own,
            RunSpec::new("agent", "bill"),
        ))
        .await
        .expect("its own session");
    assert!(billing.wait("b-1", 30_000).await.unwrap().terminal);

    // Another caller's run, in another session.
    let internal = router_with(&cluster, INTERNAL).await;
    let other = SessionKey::parse("agent:main:payroll").unwrap();
    internal
        .submit(SubmitRequest::new(
            "p-1",
            other,
            RunSpec::new("agent", "pay"),
        ))
        .await
        .unwrap();

    let mut coordinator = coordinator_client(cluster.coordinator().url()).await;
    let bound = Some(BILLING);
    let says = format!("sessions whose key starts with \"{BILLING_PREFIX}\"");
    let denied = |refused: tonic::Status| {
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains(&says), "{refused:?}");
    };
    let submit = coordinator_pb::SubmitRequest {
        run_id: "b-2".into(),
        session_key: "agent:main:payroll".into(),
        kind: "agent".into(),
        message: "not mine".into(),
        ..Default::default()
    };
    denied(
        coordinator
            .submit(with_token(submit, bound))
            .await
            .unwrap_err(),
    );
    assert!(
        run_record(&cluster, "b-2").await.is_none(),
        "nothing admitted"
    );
    // A run id another session took: its KEY_REUSED would show that run.
    let taken = coordinator_pb::SubmitRequest {
        run_id: "p-1".into(),
        session_key: "agent:billing:invoice-7".into(),
        kind: "agent".into(),
        message: "mine now?".into(),
        ..Default::default()
    };
    let refused = coordinator
        .submit(with_token(taken, bound))
        .await
        .unwrap_err();
    assert!(!refused.message().contains("payroll"), "{refused:?}");
    denied(refused);

    let by_run = Some(coordinator_pb::cancel_request::Target::RunId("p-1".into()));
    let by_session = Some(coordinator_pb::cancel_request::Target::SessionKey(
        "agent:main:payroll".into(),
    ));
    for target in [by_run, by_session] {
        let cancel = coordinator_pb::CancelRequest {
            target,
            requester: "billing".into(),
        };
        denied(
            coordinator
                .cancel(with_token(cancel, bound))
                .await
                .unwrap_err(),
        );
    }
    let wait = coordinator_pb::WaitRequest {
        run_id: "p-1".into(),
        timeout_ms: 1,
    };
    denied(coordinator.wait(with_token(wait, bound)).await.unwrap_err());
    let get = coordinator_pb::GetRequest {
        run_id: "p-1".into(),
    };
    denied(coordinator.get(with_token(get, bound)).await.unwrap_err());
    for filter in [
        coordinator_pb::subscribe_request::Filter::RunId("p-1".into()),
        coordinator_pb::subscribe_request::Filter::All(true),
    ] {
        let subscribe = coordinator_pb::SubscribeRequest {
            filter: Some(filter),
            ..Default::default()
        };
        let refused = coordinator.subscribe(with_token(subscribe, bound)).await;
        denied(refused.expect_err("refused before any event"));
    }
    // The store's run records of other sessions read as absent to it.
    let mut store = store_client(cluster.store().url()).await;
    for (run_id, visible) in [("p-1", false), ("b-1", true)] {
        let get = store_pb::GetRunRequest {
            run_id: run_id.into(),
        };
        let record = store.get_run(with_token(get, bound)).await.unwrap();
        assert_eq!(record.into_inner().record.is_some(), visible, "{run_id}");
    }
    let waited = internal.wait("p-1", 30_000).await.unwrap();
    assert!(waited.terminal, "{waited:?}");
    let payroll = run_record(&cluster, "p-1").await.expect("p-1 is recorded");
    assert_eq!(
        payroll.status,
        store_pb::RunStatus::Ok as i32,
        "the refused cancels changed nothing"
    );
}

/// Every edge method that reaches the store or the coordinators works with
/// the edge's token (and the store's writes with the coordinator's): the
/// edge's rows of the tables hold what it calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_edge_method_that_reaches_the_services_works_with_the_edges_token() {
    let cluster = start().await;
    let mut client = cluster.connect().await;
    let sent = client
        .request(
            "agent",
            json!({ "message": "hi", "idempotencyKey": "e-1", "sessionKey": "edge" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "agent: {sent}\n{}", cluster.output());
    let calls = [
        ("agent.wait", json!({ "runId": "e-1", "timeoutMs": 30_000 })),
        ("chat.history", json!({ "sessionKey": "edge" })),
        ("sessions.list", json!({})),
        ("sessions.preview", json!({ "keys": ["edge"], "limit": 3 })),
        ("sessions.patch", json!({ "key": "edge", "pinned": true })),
        ("models.list", json!({})),
        ("health", json!({})),
        ("chat.abort", json!({ "sessionKey": "edge" })),
        ("sessions.reset", json!({ "key": "edge" })),
        ("sessions.delete", json!({ "key": "edge" })),
    ];
    for (method, params) in calls {
        let answer = client.request(method, params).await;
        assert_eq!(
            answer["ok"],
            true,
            "{method}: {answer}\n{}",
            cluster.output()
        );
    }
}

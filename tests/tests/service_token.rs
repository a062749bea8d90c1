//! Service-to-service trust with a shared service token: three real
//! processes given `CLAWGATE_SERVICE_TOKEN` serve a run end to end through
//! the edge, while a gRPC caller without the token (or with another) is
//! refused `UNAUTHENTICATED` by the store and the coordinator alike;
//! health checks stay open for probes; and no process prints the token.

use clawgate_proto::run_coordinator::v1 as coordinator_pb;
use clawgate_proto::session_store::v1 as store_pb;
use clawgate_system_tests::System;
use clawgate_system_tests::bearer::{coordinator_client, store_client, with_token};
use serde_json::json;
use tonic::Code;

const SECRET: &str = "s3rvice-t0ken-for-the-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_require_the_service_token_between_them() {
    let cluster = System::builder()
        .env("CLAWGATE_SERVICE_TOKEN", SECRET)
        .start()
        .await;

    // The edge's calls carry the token: a run goes end to end.
    let mut client = cluster.connect().await;
    let sent = client
        .request(
            "chat.send",
            json!({ "sessionKey": "trusted", "message": "hello", "idempotencyKey": "t-1" }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}\n{}", cluster.output());
    let end = client.chat_end("t-1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");

    let mut store = store_client(cluster.store().url()).await;
    let mut coordinator = coordinator_client(cluster.coordinator().url()).await;
    for token in [None, Some("not-the-token"), Some("")] {
        let session = store_pb::GetSessionRequest {
            session_key: "trusted".into(),
        };
        let refused = store
            .get_session(with_token(session, token))
            .await
            .expect_err("the store refuses a call without the token");
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{token:?}: {refused:?}"
        );
        let get = coordinator_pb::GetRequest {
            run_id: "t-1".into(),
        };
        let refused = coordinator
            .get(with_token(get, token))
            .await
            .expect_err("the coordinator refuses a call without the token");
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{token:?}: {refused:?}"
        );
    }
    // With the token, the same calls are answered.
    let session = store_pb::GetSessionRequest {
        session_key: "trusted".into(),
    };
    store
        .get_session(with_token(session, Some(SECRET)))
        .await
        .expect("the store serves the token's holder");
    let get = coordinator_pb::GetRequest {
        run_id: "t-1".into(),
    };
    let run = coordinator
        .get(with_token(get, Some(SECRET)))
        .await
        .expect("the coordinator serves the token's holder")
        .into_inner();
    assert!(run.snapshot.is_some(), "{run:?}");

    // Health stays open: Kubernetes' gRPC probes send no header.
    assert!(cluster.coordinators[0].serving().await);

    // No process printed the token.
    let output = cluster.output();
    assert!(
        !output.contains(SECRET),
        "a process printed the token:\n{output}"
    );
}

//! One configuration surface: the all-in-one takes every setting of each
//! service under the service's own environment variable (and a flag), and
//! each takes effect. The real `clawgate` binary is started with one
//! non-default setting per service and each is observed from outside.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_system_tests::process::{DEFAULT_PORTS, Process};
use clawgate_system_tests::{Client, reflection, wait_for};
use futures::StreamExt;
use serde_json::json;

const TOKEN: &str = "config-test-token";

/// Every listener on port 0, the data in `data`, plus `extra` flags and
/// `env` variables; returns once the edge is ready.
async fn start(data: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Process {
    let mut command = common::all_in_one(data, TOKEN);
    command.args(extra);
    for (key, value) in env {
        command.env(key, value);
    }
    common::start(command).await
}

/// Opens a WebSocket and reads the `connect.challenge`, without connecting:
/// the socket counts against the edge's pre-auth budget until it closes.
async fn unauthenticated_socket(
    url: &str,
) -> Result<impl Sized, tokio_tungstenite::tungstenite::Error> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
    let challenge = ws.next().await.expect("a frame").expect("readable");
    assert!(challenge.to_text().unwrap().contains("connect.challenge"));
    Ok(ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_takes_its_own_settings_in_the_all_in_one() {
    let data = tempfile::tempdir().unwrap();
    let clawgate = start(
        data.path(),
        // The coordinator's, as a flag.
        &["--coordinator-max-message-bytes", "64"],
        // The edge's and the store's, as the variables their binaries read.
        &[
            ("EDGE_PREAUTH_PER_IP", "40"),
            ("SESSION_STORE_MAX_LIST_LIMIT", "50"),
        ],
    )
    .await;
    let url = format!("ws://{}", clawgate.address);

    // Edge: 40 unauthenticated sockets from one address, not the default 32;
    // the 41st is refused.
    let mut sockets = Vec::new();
    for n in 1..=40 {
        let socket = unauthenticated_socket(&url)
            .await
            .unwrap_or_else(|e| panic!("socket {n} refused: {e}"));
        sockets.push(socket);
    }
    match unauthenticated_socket(&url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503)
        }
        Err(other) => panic!("the 41st socket failed otherwise: {other}"),
        Ok(_) => panic!("the 41st socket was accepted"),
    }
    drop(sockets);
    // Their slots come back once the edge has seen them close.
    let slot = "a socket once the 40 closed";
    let mut client = wait_for(slot, Duration::from_secs(30), async || {
        let opened = Client::open_with_headers(&url, &[]).await;
        opened.map_err(|status| format!("upgrade refused: HTTP {status}"))
    })
    .await;
    client.handshake_with_token(TOKEN, OPERATOR_SCOPES).await;
    // Coordinator: messages up to 64 bytes, not the default 1 MiB.
    let send = |message: String, key: &str| json!({ "sessionKey": "config", "message": message, "idempotencyKey": key });
    let fits = client
        .request("chat.send", send("x".repeat(64), "fits"))
        .await;
    assert_eq!(fits["ok"], true, "{fits}");
    client.chat_end("fits").await;
    let over = client
        .request("chat.send", send("x".repeat(65), "over"))
        .await;
    assert_eq!(over["ok"], false, "{over}");
    assert_eq!(over["error"]["code"], "INVALID_REQUEST", "{over}");
    let message = over["error"]["message"].as_str().unwrap();
    assert!(message.contains("the maximum is 64"), "{message}");

    // Store: pages of at most 50 sessions, not the default 1000 (the edge
    // asks for 100 when the client gives no limit).
    let listed = client.request("sessions.list", json!({})).await;
    assert_eq!(listed["ok"], false, "{listed}");
    assert_eq!(listed["error"]["code"], "INVALID_REQUEST", "{listed}");
    let message = listed["error"]["message"].as_str().unwrap();
    assert!(message.contains("1..=50"), "{message}");
    let listed = client
        .request("sessions.list", json!({ "limit": 50 }))
        .await;
    assert_eq!(listed["ok"], true, "{listed}");
}

/// The test kit holds the services' default ports while tests run, so that
/// a test that forgets a port 0 fails: its list must be the binaries' own
/// defaults.
#[test]
fn the_test_kit_holds_exactly_the_default_listen_ports() {
    let command = clawgate::config::command();
    let ports: BTreeSet<u16> = command
        .get_arguments()
        .filter(|arg| arg.get_long().is_some_and(|long| long.ends_with("listen")))
        .filter_map(|arg| arg.get_default_values().first())
        .map(|default| {
            let address: std::net::SocketAddr = default.to_str().unwrap().parse().unwrap();
            address.port()
        })
        .collect();
    assert_eq!(ports, DEFAULT_PORTS.into_iter().collect());
}

/// The `http://` address of the gRPC port the banner's `label` line names.
fn grpc_address(clawgate: &Process, label: &str) -> String {
    let output = clawgate.output().join("\n");
    let line = output
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{output}"));
    let address = line.split("grpc://").nth(1).unwrap();
    format!("http://{}", address.split_whitespace().next().unwrap())
}

/// The all-in-one's two gRPC ports each list what they serve, over both
/// reflection versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_in_one_s_grpc_ports_list_what_they_serve() {
    let data = tempfile::tempdir().unwrap();
    let clawgate = start(data.path(), &[], &[]).await;
    let grpc_address = |label: &str| grpc_address(&clawgate, label);
    reflection::assert_lists_exactly(
        &grpc_address("session store"),
        &["clawgate.session_store.v1.SessionStore"],
    )
    .await;
    reflection::assert_lists_exactly(
        &grpc_address("run coordinator"),
        &["clawgate.run_coordinator.v1.RunCoordinator"],
    )
    .await;
}

/// A token the operator gave is never printed (it is theirs and known to
/// them); the banner says which auth applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_token_is_not_printed() {
    let data = tempfile::tempdir().unwrap();
    let clawgate = start(data.path(), &[], &[]).await;
    let what = "the banner";
    clawgate_system_tests::wait_until(what, std::time::Duration::from_secs(30), || {
        clawgate.output_text().contains("  data ")
    })
    .await;
    let output = clawgate.output_text();
    assert!(!output.contains(TOKEN), "{output}");
    assert!(
        output.contains("token (the one given: EDGE_TOKEN)"),
        "{output}"
    );
}

/// A shared secret under 16 bytes stops the all-in-one before it serves,
/// with the setting named and the secret not printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_token_stops_the_all_in_one_at_start() {
    let data = tempfile::tempdir().unwrap();
    let short = "short-secret";
    let (status, output) =
        clawgate_system_tests::process::refused_start(common::all_in_one(data.path(), short)).await;
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("EDGE_TOKEN is 12 bytes long: a shared secret needs 16 bytes at least"),
        "{output}"
    );
    assert!(!output.contains(short), "{output}");
}

/// Per-kind service tokens in the all-in-one: its edge calls as the edge (a
/// chat goes end to end), an internal caller reaches the coordinator but
/// not the store's sessions, and the edge's token takes no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_kind_service_tokens_hold_in_the_all_in_one() {
    use clawgate_proto::run_coordinator::v1 as coordinator_pb;
    use clawgate_proto::session_store::v1 as store_pb;
    use clawgate_system_tests::bearer::{coordinator_client, lease_grab, store_client, with_token};
    const EDGE: &str = "all-in-one-edge-token";
    const INTERNAL: &str = "all-in-one-internal-token";
    let data = tempfile::tempdir().unwrap();
    let clawgate = start(
        data.path(),
        &[],
        &[
            ("CLAWGATE_SERVICE_TOKEN", EDGE),
            ("CLAWGATE_EDGE_TOKENS", EDGE),
            ("CLAWGATE_INTERNAL_TOKENS", INTERNAL),
        ],
    )
    .await;
    let url = format!("ws://{}", clawgate.address);
    let mut client = Client::connect_with_token(&url, TOKEN, OPERATOR_SCOPES).await;
    let params = json!({ "sessionKey": "kinds", "message": "hi", "idempotencyKey": "k-1" });
    let sent = client.request("chat.send", params).await;
    assert_eq!(sent["ok"], true, "{sent}");
    let end = client.chat_end("k-1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");

    let mut store = store_client(grpc_address(&clawgate, "session store")).await;
    let history = store_pb::HistoryRequest {
        session_key: "kinds".into(),
        ..Default::default()
    };
    let refused = store
        .history(with_token(history, Some(INTERNAL)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let take = lease_grab();
    let refused = store
        .acquire_leases(with_token(take, Some(EDGE)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let mut coordinator = coordinator_client(grpc_address(&clawgate, "run coordinator")).await;
    let get = coordinator_pb::GetRequest {
        run_id: "k-1".into(),
    };
    let run = coordinator
        .get(with_token(get, Some(INTERNAL)))
        .await
        .expect("an internal caller reads runs")
        .into_inner();
    assert!(run.snapshot.is_some(), "{run:?}");
}

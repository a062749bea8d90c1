//! The all-in-one with the TLS settings: its store and coordinator serve
//! gRPC over mutual TLS, the edge reaches them over it, and a chat runs
//! end to end (without them it stays plaintext on loopback: every other
//! test here).

mod common;

use std::time::Duration;

use clawgate_system_tests::Client;
use clawgate_system_tests::client::OPERATOR_SCOPES;
use clawgate_telemetry::tls::testing::{Ca, hex};
use clawgate_telemetry::tls::{ClientTls, serial_hex};
use serde_json::json;

const TOKEN: &str = "tls-test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_in_one_serves_its_grpc_ports_over_mutual_tls_when_told() {
    let data = tempfile::tempdir().unwrap();
    let ca = Ca::new("all-in-one CA");
    let ca_file = ca.write(data.path());
    let (cert, key) = ca.leaf("clawgate", 77).write(data.path());
    let mut command = common::all_in_one(data.path(), TOKEN);
    command
        .env("CLAWGATE_TLS_CERT", &cert)
        .env("CLAWGATE_TLS_KEY", &key)
        .env("CLAWGATE_TLS_CLIENT_CA", &ca_file)
        .env("CLAWGATE_TLS_CA", &ca_file);
    let clawgate = common::start(command).await;

    let url = format!("ws://{}", clawgate.address);
    let mut client = Client::connect_with_token(&url, TOKEN, OPERATOR_SCOPES).await;
    let params = json!({ "sessionKey": "tls", "message": "hi", "idempotencyKey": "aio-tls-1" });
    let sent = client.request("chat.send", params).await;
    assert_eq!(sent["ok"], true, "{sent}\n{}", clawgate.output_text());
    let end = client.chat_end("aio-tls-1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");

    // Both gRPC ports serve the certificate, to a client that has one.
    clawgate_system_tests::wait_until("the banner", Duration::from_secs(30), || {
        clawgate.output_text().contains("  data ")
    })
    .await;
    let output = clawgate.output_text();
    let client_tls = ClientTls::new(Some(ca_file.clone()), Some((cert, key))).unwrap();
    for label in ["session store", "run coordinator"] {
        let line = output
            .lines()
            .find(|line| line.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in:\n{output}"));
        let address = line.split("grpc://").nth(1).unwrap();
        let address = address.split_whitespace().next().unwrap().parse().unwrap();
        let served = client_tls.handshake(address).await.unwrap();
        assert_eq!(serial_hex(&served), Some(hex(77)), "{label}");
    }
}

//! Behind a load balancer: forwarding headers name the client for the
//! per-IP limits, but only from trusted proxies; and a browser Origin other
//! than the edge's own is refused unless allowed.

mod common;

use common::*;
use serde_json::Value;

/// Opens a socket as a client the balancer forwards for; the HTTP status
/// when refused.
async fn open_for(url: &str, client: &str) -> Result<Client, u16> {
    let mut socket = Client::open_with_headers(url, &[("x-forwarded-for", client)]).await?;
    let challenge = socket.next_frame().await.expect("a challenge");
    assert_eq!(challenge["event"], "connect.challenge");
    Ok(socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxy_forwards_the_client_for_per_ip_limits() {
    let system = System::start().await;
    let mut config = system.edge_config();
    config.preauth_per_ip = 1;
    config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    let (url, _edge) = system.edge(config).await;

    let _a = open_for(&url, "203.0.113.1").await.expect("client .1");
    let _b = open_for(&url, "203.0.113.2").await.expect("another client");
    assert_eq!(
        open_for(&url, "203.0.113.1").await.err(),
        Some(503),
        "the same client's second unauthenticated socket"
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_from_anyone_else_are_ignored() {
    let system = System::start().await;
    let mut config = system.edge_config();
    config.preauth_per_ip = 1;
    let (url, _edge) = system.edge(config).await;

    let _a = open_for(&url, "203.0.113.1")
        .await
        .expect("the first socket");
    // Another forwarded address does not make the same peer someone else.
    assert_eq!(open_for(&url, "203.0.113.2").await.err(), Some(503));
    system.stop.cancel();
}

async fn connect_from(url: &str, origin: &str) -> Value {
    let mut socket = Client::open_with_headers(url, &[("origin", origin)])
        .await
        .expect("the upgrade");
    let challenge = socket.next_frame().await.expect("a challenge");
    assert_eq!(challenge["event"], "connect.challenge");
    let res = socket.request("connect", connect_params(&[READ])).await;
    if res["ok"] != true {
        let (code, _) = socket.until_closed().await;
        assert_eq!(code, 1008, "{res}");
    }
    res
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_edges_own_origin_and_allowed_ones_may_connect() {
    let system = System::start().await;
    let mut config = system.edge_config();
    config.allowed_origins = vec!["https://ui.example.com".into()];
    let (url, _edge) = system.edge(config).await;
    let own = url.replace("ws://", "http://");

    let refused = connect_from(&url, "https://evil.example").await;
    assert_eq!(refused["ok"], false);
    assert_eq!(refused["error"]["code"], "INVALID_REQUEST", "{refused}");
    assert_eq!(
        refused["error"]["details"]["code"],
        "CONTROL_UI_ORIGIN_NOT_ALLOWED"
    );
    for origin in [own.as_str(), "https://ui.example.com"] {
        let res = connect_from(&url, origin).await;
        assert_eq!(res["ok"], true, "{origin}: {res}");
    }
    system.stop.cancel();
}

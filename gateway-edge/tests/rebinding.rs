//! DNS rebinding (docs/security.md): an edge on loopback answers only
//! requests whose `Host` is a loopback name (or in `--allowed-hosts`), and
//! in auth mode `none` only clients on loopback. A page whose name was
//! rebound to 127.0.0.1 sends its own name as Host and as Origin: refused
//! 403, while a local client is served.

mod common;

use clawgate_system_tests::raw_socket::{read_until_closed, sending};
use common::*;
use gateway_edge::config::AuthMode;
use serde_json::json;

/// The edge in auth mode `none`, on loopback.
async fn no_auth(system: &Sandbox, allowed_hosts: &[&str]) -> String {
    let mut config = system.edge_config();
    config.auth_mode = AuthMode::None;
    config.token = None;
    config.allowed_hosts = allowed_hosts.iter().map(|h| (*h).to_owned()).collect();
    config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    system.edge(config).await.0
}

fn port(url: &str) -> &str {
    url.rsplit(':').next().unwrap()
}

async fn served(client: &mut Client) {
    let health = client.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
}

/// A plain `GET path` with `host`: the answer's status line and body.
async fn get(url: &str, path: &str, host: &str) -> String {
    let at = url.trim_start_matches("ws://").parse().unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut stream = sending(at, "127.0.0.1".parse().unwrap(), &request).await;
    read_until_closed(&mut stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_mode_none_refuses_rebound_names_and_remote_clients_and_serves_loopback() {
    let system = system().await;
    let url = no_auth(&system, &["gw.internal"]).await;
    let port = port(&url);
    let evil = format!("evil.example:{port}");
    let evil_origin = format!("http://{evil}");

    // The rebound page: its Host and Origin agree, and are not local.
    let refused =
        Client::open_with_headers(&url, &[("host", &evil), ("origin", &evil_origin)]).await;
    assert_eq!(refused.err(), Some(403));
    let page = get(&url, "/", &evil).await;
    assert!(page.starts_with("HTTP/1.1 403"), "{page}");
    assert!(page.contains("EDGE_ALLOWED_HOSTS"), "{page}");

    // A local proxy forwarding a remote client: not a loopback client.
    let forwarded = Client::open_with_headers(&url, &[("x-forwarded-for", "203.0.113.9")]).await;
    assert_eq!(forwarded.err(), Some(403));
    let answer = get(&url, "/healthz", "localhost").await;
    assert!(answer.contains("200 OK"), "{answer}");

    // Loopback names, and the allowed one, are served, with no secret.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("gw.internal:{port}"),
    ] {
        let mut local = Client::open_with_headers(&url, &[("host", &host)])
            .await
            .unwrap_or_else(|status| panic!("{host}: {status}"));
        local.handshake(&[READ]).await;
        served(&mut local).await;
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_on_loopback_with_a_token_refuses_rebound_names_too() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let evil = format!("evil.example:{}", port(&url));
    let refused = Client::open_with_headers(&url, &[("host", &evil)]).await;
    assert_eq!(refused.err(), Some(403));
    let mut local = Client::connect(&url, &[READ]).await;
    served(&mut local).await;
    system.stop.cancel();
}

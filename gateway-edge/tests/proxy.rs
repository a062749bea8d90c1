//! Behind a load balancer: forwarding headers name the client for the
//! per-IP limits, but only from trusted proxies; and a browser Origin other
//! than the edge's own is refused unless allowed.

mod common;

use common::*;
use gateway_edge::config::ForwardedHeader;
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
    let system = system().await;
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
    let system = system().await;
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
    let system = system().await;
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

/// A proxy that appends to X-Forwarded-For passes a client's own
/// `Forwarded` through: only the header the proxy sets counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_header_the_proxy_sets_names_the_client() {
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let system = system().await;
        let mut config = system.edge_config();
        config.preauth_per_ip = 1;
        config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
        config.forwarded_header = header;
        let (url, _edge) = system.edge(config).await;
        let (set, passed) = match header {
            ForwardedHeader::XForwardedFor => ("x-forwarded-for", "forwarded"),
            ForwardedHeader::Forwarded => ("forwarded", "x-forwarded-for"),
        };
        let value = |ip: &str| match set {
            "forwarded" => format!("for={ip}"),
            _ => ip.to_owned(),
        };
        let spoof = |ip: &str| match passed {
            "forwarded" => format!("for={ip}"),
            _ => ip.to_owned(),
        };
        let open = async |client: &str, claimed: &str| {
            let headers = [(set, value(client)), (passed, spoof(claimed))];
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            Client::open_with_headers(&url, &headers).await
        };
        let _first = open("203.0.113.1", "192.0.2.1").await.expect("the first");
        // Claiming another address in the other header changes nothing.
        assert_eq!(
            open("203.0.113.1", "192.0.2.2").await.err(),
            Some(503),
            "{header:?}"
        );
        assert!(open("203.0.113.2", "192.0.2.1").await.is_ok(), "{header:?}");
        system.stop.cancel();
    }
}

/// Connects as the client `forwarded_for` with `token`; the answer.
async fn connect_as(url: &str, forwarded_for: &str, token: &str) -> Value {
    let mut socket = Client::open_with_headers(url, &[("x-forwarded-for", forwarded_for)])
        .await
        .expect("the upgrade");
    socket.next_frame().await.expect("a challenge");
    let params = clawgate_client::ConnectParams::operator(
        clawgate_system_tests::client::client_info(),
        &[READ],
    )
    .token(token);
    socket.request("connect", params.to_json()).await
}

/// The failed-auth table is bounded: failures from made-up addresses do
/// not grow it past its bound, a client that keeps failing is still
/// refused, and a client with the token connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failed_auth_table_is_bounded() {
    let system = system().await;
    let mut config = system.edge_config();
    config.auth_failures_per_minute = 3;
    config.auth_failure_addresses = 8;
    config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    let (url, edge) = system.edge(config).await;
    for n in 0..40 {
        let made_up = format!("198.51.100.{n}");
        let refused = connect_as(&url, &made_up, "wrong").await;
        assert_eq!(
            refused["error"]["details"]["code"], "AUTH_TOKEN_MISMATCH",
            "{refused}"
        );
        // The brute-forcer's attempts come between them, often enough to
        // stay in the table (an address pushed out by made-up ones starts
        // its count again: the price of the bound).
        if n % 3 == 0 {
            connect_as(&url, "203.0.113.66", "wrong").await;
        }
        assert!(
            edge.auth.failure_addresses() <= 8,
            "{}",
            edge.auth.failure_addresses()
        );
    }
    let limited = connect_as(&url, "203.0.113.66", "wrong").await;
    assert_eq!(
        limited["error"]["details"]["code"], "AUTH_RATE_LIMITED",
        "{limited}"
    );
    let good = connect_as(&url, "203.0.113.7", TOKEN).await;
    assert_eq!(good["ok"], true, "{good}");
    system.stop.cancel();
}

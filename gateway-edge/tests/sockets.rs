//! Sockets before the upgrade (docs/security.md, "The edge's limits"): the
//! request head timeout, the idle timeout of plain HTTP, the caps on open
//! sockets per address and in all, and the global cap on unauthenticated
//! sockets. Each is crossed by a careless or hostile socket while a client
//! from another address connects, authenticates and is served; what was
//! accepted before stays served.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clawgate_system_tests::raw_socket::{connect_from, read_until_closed, sending};
use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;

fn ip(raw: &str) -> IpAddr {
    raw.parse().unwrap()
}

/// The attacker's address and the good client's.
const ATTACKER: &str = "127.0.0.1";
const GOOD: &str = "127.0.0.2";

fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("ws://").parse().unwrap()
}

async fn served(client: &mut Client) {
    let health = client.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
}

const HALF_A_HEAD: &str = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_never_finishes_its_request_head_is_closed() {
    let system = system().await;
    let mut config = system.edge_config();
    config.header_read_timeout = Duration::from_millis(300);
    let (url, edge) = system.edge(config).await;
    let at = address(&url);
    let mut bystander = Client::connect_from(&url, ip(GOOD), &[WRITE]).await;

    let mut silent = connect_from(at, ip(ATTACKER)).await.unwrap();
    let mut half = sending(at, ip(ATTACKER), HALF_A_HEAD).await;
    assert_eq!(
        read_until_closed(&mut half).await,
        "",
        "closed without an answer"
    );
    assert_eq!(read_until_closed(&mut silent).await, "");
    served(&mut bystander).await;
    // Their places are given back: only the bystander's socket is open.
    wait_until(
        "the closed sockets' places to be given back",
        DEADLINE,
        || gauge(&edge, "clawgate_edge_sockets_open") == 1.0,
    )
    .await;

    // A keep-alive connection waiting for its next request is closed alike,
    // after answering the one it sent.
    let mut keep_alive = sending(
        at,
        ip(ATTACKER),
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .await;
    let answered = read_until_closed(&mut keep_alive).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    served(&mut bystander).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_connection_that_stalls_is_closed_after_the_idle_timeout() {
    let system = system().await;
    let mut config = system.edge_config();
    config.header_read_timeout = Duration::from_secs(3600);
    config.http_idle_timeout = Duration::from_millis(300);
    let (url, edge) = system.edge(config).await;
    let mut bystander = Client::connect_from(&url, ip(GOOD), &[WRITE]).await;

    // Requests pipelined and their answers never read: once the socket's
    // buffers are full, the edge's write of an answer waits, and no byte
    // moves either way (every head was whole: the head timeout is met).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(SocketAddr::new(ip(ATTACKER), 0)).unwrap();
    let mut stalled = socket.connect(address(&url)).await.unwrap();
    let writer = tokio::spawn(async move {
        let requests = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(1000);
        // Ends when the edge closes the socket.
        while stalled.write_all(requests.as_bytes()).await.is_ok() {}
    });
    wait_until("the stalled socket to be closed", DEADLINE, || {
        writer.is_finished()
    })
    .await;
    wait_until("only the bystander's socket to be open", DEADLINE, || {
        gauge(&edge, "clawgate_edge_sockets_open") == 1.0
    })
    .await;
    served(&mut bystander).await;
    system.stop.cancel();
}

/// The value of an unlabelled metric of `edge`'s registry.
fn gauge(edge: &gateway_edge::state::Edge, name: &str) -> f64 {
    gauge_labelled(edge, name, "")
}

/// A `GET /healthz` on a new socket from `source`: the answer's text
/// (empty when the socket was reset before it could be read).
async fn health_from(at: SocketAddr, source: IpAddr) -> String {
    let mut stream = sending(
        at,
        source,
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    read_until_closed(&mut stream).await
}

/// Whether `answer` is the refusal of a socket over a cap, with `body`.
fn refused_with(answer: &str, body: &str) -> bool {
    answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n")
        && answer.ends_with(&format!("\r\n\r\n{body}\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_over_the_per_address_cap_are_answered_503_and_closed() {
    let system = system().await;
    let mut config = system.edge_config();
    config.sockets_per_ip = 3;
    let (url, edge) = system.edge(config).await;
    let at = address(&url);
    // An authenticated client of the attacker's address, accepted first,
    // and two sockets that say nothing.
    let mut earlier = Client::connect_from(&url, ip(ATTACKER), &[WRITE]).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(connect_from(at, ip(ATTACKER)).await.unwrap());
    }
    let mut over = connect_from(at, ip(ATTACKER)).await.unwrap();
    let refused = read_until_closed(&mut over).await;
    assert!(
        refused_with(&refused, "Too many sockets from this address"),
        "{refused:?}"
    );
    // Another address is not affected, and what was accepted is served:
    // the authenticated client, and a request on a held socket.
    let mut good = Client::connect_from(&url, ip(GOOD), &[WRITE]).await;
    served(&mut good).await;
    served(&mut earlier).await;
    let mut first = held.remove(0);
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answered = read_until_closed(&mut first).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    // That socket is gone: its place is the address's again.
    wait_for("the address's place to come back", DEADLINE, async || {
        let answer = health_from(at, ip(ATTACKER)).await;
        if answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(answer)
        }
    })
    .await;
    assert!(
        gauge_labelled(
            &edge,
            "clawgate_edge_sockets_refused_total",
            "{stage=\"accept\",reason=\"per_address\"}"
        ) >= 1.0
    );
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_over_the_total_cap_are_answered_503_and_closed() {
    let system = system().await;
    let mut config = system.edge_config();
    config.max_sockets = 3;
    let (url, _) = system.edge(config).await;
    let at = address(&url);
    let mut good = Client::connect_from(&url, ip(GOOD), &[WRITE]).await;
    let _held: Vec<_> = futures::future::join_all(
        ["127.0.0.3", "127.0.0.4"].map(|source| connect_from(at, ip(source))),
    )
    .await;
    let mut over = connect_from(at, ip("127.0.0.5")).await.unwrap();
    let refused = read_until_closed(&mut over).await;
    assert!(refused_with(&refused, "Too many sockets"), "{refused:?}");
    served(&mut good).await;
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_sockets_over_the_global_cap_are_refused_503() {
    let system = system().await;
    let mut config = system.edge_config();
    config.max_preauth = 2;
    let (url, _) = system.edge(config).await;
    let mut good = Client::connect_from(&url, ip(GOOD), &[WRITE]).await;
    // Two addresses, one unauthenticated socket each: the gateway's two.
    let mut pending = Client::open_from(&url, ip("127.0.0.3")).await.unwrap();
    let _other = Client::open_from(&url, ip("127.0.0.4")).await.unwrap();
    let refused = Client::open_from(&url, ip("127.0.0.5")).await.err();
    assert_eq!(
        refused,
        Some((
            503,
            "Too many unauthenticated sockets on this gateway".to_owned()
        ))
    );
    // What was authenticated before is served; a socket that authenticates
    // gives its place back.
    served(&mut good).await;
    pending.handshake(&[WRITE]).await;
    served(&mut pending).await;
    let mut next = Client::open_from(&url, ip("127.0.0.5")).await.unwrap();
    next.handshake(&[WRITE]).await;
    served(&mut next).await;
    system.stop.cancel();
}

fn gauge_labelled(edge: &gateway_edge::state::Edge, name: &str, labels: &str) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    edge.metrics.register(&mut registry);
    let text = clawgate_telemetry::metrics::encode(&registry).unwrap();
    clawgate_telemetry::metrics::sample_value(&text, name, labels).unwrap_or(-1.0)
}

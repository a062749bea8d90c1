//! Edge benchmarks (numbers for docs/benchmarks.md, not assertions):
//! connect→hello-ok, `health` and `chat.send` ACK latency with 1 and 64
//! connections, ACKs/s, and the edge's RSS per idle authenticated
//! connection with 10,000 of them. The store and coordinator run in this
//! process; the edge is its own process (the `gateway-edge` binary) so its
//! memory can be read on its own. Run: `cargo bench -p gateway-edge`.
//! Without `--bench` (under `cargo test --all-targets`) it makes a short
//! smoke run.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
const TOKEN: &str = "benchtoken";

struct Sizes {
    connects: usize,
    requests_single: usize,
    requests_each_of_64: usize,
    idle_connections: usize,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn next_json(ws: &mut Ws) -> Value {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(&text).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("connection ended: {other:?}"),
        }
    }
}

/// Opens and authenticates a connection; returns it and the time it took.
async fn connect(url: &str) -> (Ws, Duration) {
    let started = Instant::now();
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let _challenge = next_json(&mut ws).await;
    let hello = json!({"type":"req","id":"c","method":"connect","params":{
        "minProtocol":4,"maxProtocol":4,
        "client":{"id":"cli","version":"bench","platform":"linux","mode":"cli"},
        "auth":{"token":TOKEN},"role":"operator","scopes":["operator.write"]}});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    loop {
        let frame = next_json(&mut ws).await;
        if frame["type"] == "res" {
            assert_eq!(frame["ok"], true, "{frame}");
            return (ws, started.elapsed());
        }
    }
}

/// Sends `count` requests one after another; returns each latency in µs.
async fn requests(ws: &mut Ws, count: usize, make: impl Fn(usize) -> (String, Value)) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(count);
    for n in 0..count {
        let (method, params) = make(n);
        let id = format!("r{n}");
        let started = Instant::now();
        ws.send(Message::text(
            json!({"type":"req","id":id,"method":method,"params":params}).to_string(),
        ))
        .await
        .unwrap();
        loop {
            let frame = next_json(ws).await;
            if frame["type"] == "res" && frame["id"] == id.as_str() {
                break;
            }
        }
        latencies.push(started.elapsed().as_micros() as u64);
    }
    latencies
}

fn row(name: &str, connections: usize, mut latencies: Vec<u64>, elapsed: Duration) {
    latencies.sort_unstable();
    println!(
        "| {name} | {connections} | {} | {} | {:.0} |",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.len() as f64 / elapsed.as_secs_f64()
    );
}

async fn parallel(
    url: &str,
    connections: usize,
    each: usize,
    method: &'static str,
    tag: &str,
) -> (Vec<u64>, Duration) {
    let mut sockets = Vec::new();
    for _ in 0..connections {
        sockets.push(connect(url).await.0);
    }
    let started = Instant::now();
    let tasks: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(c, mut ws)| {
            let tag = tag.to_owned();
            tokio::spawn(async move {
                requests(&mut ws, each, |n| match method {
                    "health" => ("health".into(), json!({})),
                    _ => (
                        "chat.send".into(),
                        json!({"sessionKey": format!("bench-{tag}-{c}"), "message": "hi", "idempotencyKey": format!("{tag}-{c}-{n}")}),
                    ),
                })
                .await
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    (all, started.elapsed())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let sizes = if benchmarking {
        Sizes {
            connects: 300,
            requests_single: 2000,
            requests_each_of_64: 100,
            idle_connections: 10_000,
        }
    } else {
        println!("(smoke run: the numbers mean nothing; use `cargo bench -p gateway-edge`)");
        Sizes {
            connects: 5,
            requests_single: 20,
            requests_each_of_64: 2,
            idle_connections: 50,
        }
    };
    let stop = CancellationToken::new();
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 2,
        pace: Duration::ZERO,
    }));
    let config = CoordinatorConfig {
        max_executing: 64,
        ..CoordinatorConfig::default()
    };
    let services = clawgate_system_tests::local::spawn(dir.path(), runtime, config, stop.clone())
        .await
        .unwrap();
    let (store_url, coordinator_url) = (services.store_url, services.coordinator_url);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut edge = tokio::process::Command::new(env!("CARGO_BIN_EXE_gateway-edge"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--coordinator-address",
            &coordinator_url,
            "--store-address",
            &store_url,
        ])
        .args([
            "--token",
            TOKEN,
            "--max-connections",
            "20000",
            "--preauth-per-ip",
            "256",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start gateway-edge");
    let url = format!("ws://127.0.0.1:{port}");
    let ready = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < ready, "edge did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    println!("| measurement | connections | p50 µs | p99 µs | per second |");
    println!("|---|---|---|---|---|");
    let started = Instant::now();
    let mut connects = Vec::new();
    for _ in 0..sizes.connects {
        connects.push(connect(&url).await.1.as_micros() as u64);
    }
    row("connect → hello-ok", 1, connects, started.elapsed());

    let (mut ws, _) = connect(&url).await;
    let started = Instant::now();
    let latencies = requests(&mut ws, sizes.requests_single, |_| {
        ("health".into(), json!({}))
    })
    .await;
    row("health", 1, latencies, started.elapsed());
    let (latencies, elapsed) = parallel(&url, 64, sizes.requests_each_of_64, "health", "h").await;
    row("health", 64, latencies, elapsed);

    let started = Instant::now();
    let latencies = requests(&mut ws, sizes.requests_single / 4, |n| {
        (
            "chat.send".into(),
            json!({"sessionKey":"bench-single","message":"hi","idempotencyKey":format!("s-{n}")}),
        )
    })
    .await;
    row("chat.send ACK", 1, latencies, started.elapsed());
    let (latencies, elapsed) =
        parallel(&url, 64, sizes.requests_each_of_64, "chat.send", "p").await;
    row("chat.send ACK", 64, latencies, elapsed);
    drop(ws);

    // Idle authenticated connections: the edge's RSS growth per connection.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = edge.id().unwrap();
    let before = rss_kib(pid);
    let mut idle = Vec::with_capacity(sizes.idle_connections);
    for chunk in 0..sizes.idle_connections.div_ceil(100) {
        let batch: Vec<_> = (0..100.min(sizes.idle_connections - chunk * 100))
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { connect(&url).await.0 })
            })
            .collect();
        for task in batch {
            idle.push(task.await.unwrap());
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    println!();
    println!(
        "edge RSS: {before} KiB before, {after} KiB with {} idle authenticated connections = {:.1} KiB per connection",
        idle.len(),
        (after.saturating_sub(before)) as f64 / idle.len() as f64
    );
    drop(idle);
    let _ = edge.start_kill();
    stop.cancel();
}

//! Edge benchmarks (numbers for docs/benchmarks.md, not assertions):
//! connect→hello-ok, `health` and `chat.send` ACK latency with 1 and 64
//! connections, ACKs/s, and the edge's RSS per idle authenticated
//! connection with 10,000 of them. The store and coordinator run in this
//! process; the edge is its own process (the `gateway-edge` binary) so its
//! memory can be read on its own. Run: `cargo bench -p gateway-edge`.
//! Without `--bench` (under `cargo test --all-targets`) it makes a short
//! smoke run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_client::socket::{self, WebSocket as Ws};
use clawgate_client::{ClientInfo, ConnectParams, OpenOptions};
use clawgate_system_tests::Sandbox;
use clawgate_system_tests::client::TOKEN;
use clawgate_system_tests::process::{Process, service_command, until_ready};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use serde_json::{Value, json};

/// How long one frame may take to come.
const FRAME_TIMEOUT: Duration = Duration::from_secs(60);

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
    let deadline = tokio::time::Instant::now() + FRAME_TIMEOUT;
    socket::next_json(ws, Some(deadline), "a frame")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Opens and authenticates a connection; returns it and the time it took.
async fn connect(url: &str) -> (Ws, Duration) {
    let started = Instant::now();
    let mut ws = socket::open(url, &OpenOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = ClientInfo::new("cli", "cli", "bench");
    let params = ConnectParams::operator(client, &["operator.write"]).token(TOKEN);
    let deadline = tokio::time::Instant::now() + FRAME_TIMEOUT;
    socket::handshake(&mut ws, &params, deadline)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (ws, started.elapsed())
}

/// Sends `count` requests one after another; returns each latency in µs.
async fn requests(ws: &mut Ws, count: usize, make: impl Fn(usize) -> (String, Value)) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(count);
    for n in 0..count {
        let (method, params) = make(n);
        let id = format!("r{n}");
        let started = Instant::now();
        let frame = clawgate_client::frame::request(&id, &method, params);
        socket::send_json(ws, &frame)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
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
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 2,
        pace: Duration::ZERO,
    }));
    let config = CoordinatorConfig {
        max_executing: 64,
        ..CoordinatorConfig::default()
    };
    let sandbox = Sandbox::builder()
        .runtime(runtime)
        .config(config)
        .start()
        .await;
    let mut command = service_command(env!("CARGO_BIN_EXE_gateway-edge"));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--coordinator-address", sandbox.coordinator_url()])
        .args(["--store-address", sandbox.store_url()])
        .args(["--token", TOKEN])
        .args(["--max-connections", "20000", "--preauth-per-ip", "256"])
        // Every socket comes from 127.0.0.1.
        .args(["--sockets-per-ip", "20000", "--max-preauth", "20000"]);
    let edge = Process::start(command, "gateway-edge", "gateway edge listening").await;
    until_ready(edge.address, || edge.output_text()).await;
    let url = format!("ws://{}", edge.address);

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
    let rss_kib = || edge.status_kib("VmRSS").unwrap_or(0);
    let before = rss_kib();
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
    let after = rss_kib();
    println!();
    println!(
        "edge RSS: {before} KiB before, {after} KiB with {} idle authenticated connections = {:.1} KiB per connection",
        idle.len(),
        (after.saturating_sub(before)) as f64 / idle.len() as f64
    );
    drop(idle);
    drop(edge);
    sandbox.finish().await;
}

//! What tracing costs a request: `chat.send` ACK latency (request frame out
//! → `res` back) through the three real services, each a process of its
//! own, in three set-ups:
//!
//! * `off`: no OTLP endpoint (no exporter, no trace layer);
//! * `dead collector`: the endpoint is a closed port, so every export fails
//!   (spans are still built, queued and counted as failed);
//! * `live collector`: an in-process OTLP receiver accepts everything.
//!
//! The three clusters run side by side and requests go to them in turn, one
//! at a time, so that drift of the machine and background work (the live
//! cluster's exports) hit all three alike; each request waits for its run
//! to finish, so no backlog of runs skews later ACKs. Numbers for
//! docs/benchmarks.md, not assertions.
//!
//! Run: `cargo build --release --bins && cargo bench -p clawgate-system-tests
//! --bench trace_overhead`. Without `--bench` (under `cargo test
//! --all-targets`, with debug binaries) it makes a short smoke run.

use std::time::{Duration, Instant};

use clawgate_system_tests::{Client, System, TraceReceiver};
use serde_json::json;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Off,
    DeadCollector,
    LiveCollector,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Off, Setup::DeadCollector, Setup::LiveCollector];

    fn label(self) -> &'static str {
        match self {
            Setup::Off => "off (no endpoint)",
            Setup::DeadCollector => "dead collector (closed port)",
            Setup::LiveCollector => "live collector",
        }
    }
}

/// A local port nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

async fn start(setup: Setup, receiver: &TraceReceiver) -> System {
    let builder = System::builder().echo(1, Duration::ZERO);
    let builder = match setup {
        Setup::Off => builder,
        Setup::DeadCollector => builder.env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", closed_port().await),
        ),
        Setup::LiveCollector => builder.env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()),
    };
    // The default 5 s batching would let a short round end before any
    // export; export often so the exporter's work falls inside the round.
    builder.env("OTEL_BSP_SCHEDULE_DELAY", "200").start().await
}

/// Sends request `n` (a chat.send) and waits for its run to end; returns
/// the ACK latency (µs).
async fn ack(client: &mut Client, n: usize) -> u64 {
    let run_id = format!("bench-{n}-{}", std::process::id());
    let params = json!({
        "sessionKey": format!("agent:main:bench-{}", n % 8),
        "message": "hi",
        "idempotencyKey": run_id,
    });
    let started = Instant::now();
    let id = client
        .send_request("chat.send", params, serde_json::Map::new())
        .await;
    let res = client.response(&id).await;
    let latency = started.elapsed().as_micros() as u64;
    assert_eq!(res["ok"], true, "{res}");
    client.chat_end(&run_id).await;
    latency
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (requests, warmup) = if full { (3000, 200) } else { (10, 2) };
    let receiver = TraceReceiver::start().await;
    let mut clusters = Vec::new();
    for setup in Setup::ALL {
        let cluster = start(setup, &receiver).await;
        let client = cluster.connect().await;
        clusters.push((cluster, client));
    }
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(requests); Setup::ALL.len()];
    for n in 0..warmup + requests {
        for (index, (_, client)) in clusters.iter_mut().enumerate() {
            let latency = ack(client, n).await;
            if n >= warmup {
                samples[index].push(latency);
            }
        }
    }
    println!("chat.send ACK latency through edge → coordinator → store (three processes), µs");
    println!("| tracing | requests | p50 | p90 | p99 | mean | p50 vs off |");
    println!("|---|---|---|---|---|---|---|");
    let mut off_p50 = 0;
    for (setup, mut latencies) in Setup::ALL.into_iter().zip(samples) {
        latencies.sort_unstable();
        let p50 = percentile(&latencies, 0.5);
        if setup == Setup::Off {
            off_p50 = p50;
        }
        let mean = latencies.iter().sum::<u64>() / latencies.len() as u64;
        println!(
            "| {} | {} | {} | {} | {} | {} | {:+.1}% |",
            setup.label(),
            latencies.len(),
            p50,
            percentile(&latencies, 0.9),
            percentile(&latencies, 0.99),
            mean,
            (p50 as f64 / off_p50 as f64 - 1.0) * 100.0
        );
    }
    println!(
        "spans received by the live collector: {}",
        receiver.spans().len()
    );
    println!("\nCPU time per request, µs (edge / coordinator / store)");
    for (setup, (cluster, _)) in Setup::ALL.into_iter().zip(&clusters) {
        let per_request = |process: &clawgate_system_tests::process::Process| {
            process.cpu_time().map_or_else(
                || "?".to_owned(),
                |cpu| (cpu.as_micros() / (warmup + requests) as u128).to_string(),
            )
        };
        println!(
            "{}: {} / {} / {}",
            setup.label(),
            per_request(cluster.edge()),
            per_request(cluster.coordinator()),
            per_request(cluster.store())
        );
    }
}

//! Submit ACK latency and completed echo runs per second, through the real
//! gRPC services (store on the embedded backend, coordinator over gRPC to it).
//! Run: `cargo bench -p run-coordinator`. `BENCH_SECONDS` (default 3) per case.
//! Under `cargo test --all-targets` (no `--bench`) it makes a short smoke run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Case {
    acks_us: Vec<u64>,
    completed: usize,
    elapsed: Duration,
}

/// `concurrency` clients, each submitting a run on its own session and
/// waiting for it to finish, over and over.
async fn run_case(address: &str, concurrency: usize, per_case: Duration, tag: &str) -> Case {
    let started = Instant::now();
    let until = started + per_case;
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let address = address.to_owned();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut client = RunCoordinatorClient::connect(address).await.unwrap();
            let mut acks = Vec::new();
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let run_id = format!("{tag}-{worker}-{n}");
                let sent = Instant::now();
                client
                    .submit(pb::SubmitRequest {
                        run_id: run_id.clone(),
                        session_key: format!("bench-{tag}-{worker}"),
                        kind: "agent".into(),
                        message: "bench message with a few words".into(),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                acks.push(sent.elapsed().as_micros() as u64);
                let waited = client
                    .wait(pb::WaitRequest {
                        run_id,
                        timeout_ms: 60_000,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert!(waited.terminal);
            }
            acks
        }));
    }
    let mut acks_us = Vec::new();
    for task in tasks {
        acks_us.extend(task.await.unwrap());
    }
    acks_us.sort_unstable();
    Case {
        completed: acks_us.len(),
        acks_us,
        elapsed: started.elapsed(),
    }
}

#[tokio::main]
async fn main() {
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let per_case = if benchmarking {
        Duration::from_secs(
            std::env::var("BENCH_SECONDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(3),
        )
    } else {
        println!("(smoke run: the numbers mean nothing; use `cargo bench -p run-coordinator`)");
        Duration::from_millis(100)
    };
    // Echo with no pacing: the cost measured is the coordinator's and the store's.
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 4,
        pace: Duration::ZERO,
    }));
    let config = CoordinatorConfig {
        max_executing: 64,
        ..CoordinatorConfig::default()
    };
    let sandbox = clawgate_system_tests::Sandbox::start(runtime, config).await;
    let address = sandbox.coordinator_url().to_owned();

    println!("| concurrency | Submit ACK p50 µs | ACK p99 µs | completed runs/s |");
    println!("|---|---|---|---|");
    for (index, concurrency) in [1, 8, 32].into_iter().enumerate() {
        let case = run_case(&address, concurrency, per_case, &format!("c{index}")).await;
        println!(
            "| {concurrency} | {} | {} | {:.0} |",
            percentile(&case.acks_us, 0.5),
            percentile(&case.acks_us, 0.99),
            case.completed as f64 / case.elapsed.as_secs_f64()
        );
    }
    sandbox.finish().await;
}

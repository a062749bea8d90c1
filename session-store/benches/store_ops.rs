//! Append and AcquireWriter through the gRPC server, per backend, at
//! concurrency 1 and 32. Run: `cargo bench -p session-store`.
//! `BENCH_SECONDS` (default 3) sets the time per case; the database is the
//! tests' (`CLAWGATE_TEST_POSTGRES_URL`, default the local one), in a
//! schema of the bench's own.
//! Prints a Markdown table; docs/benchmarks.md keeps the measured numbers.
//! Under `cargo test --all-targets` (no `--bench` argument) it makes a short
//! smoke run instead, so the bench keeps working without costing CI time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use session_store::SessionKey;
use session_store::SessionStore;
use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store::backend::postgres::{PgOptions, PostgresStore};
use session_store::grpc::client::RemoteStore;
use session_store::model::*;
use session_store::server::{ServeOptions, serve_store};

#[derive(Clone, Copy)]
enum Op {
    Append,
    AcquireWriter,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Append => "Append (1 entry, ~150 B)",
            Op::AcquireWriter => "AcquireWriter (CAS)",
        }
    }
}

struct Sample {
    ops: usize,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn worker(store: RemoteStore, id: usize, op: Op, until: Instant) -> Vec<u64> {
    let key = SessionKey::parse(&format!("bench-{id}-{}", uuid::Uuid::new_v4())).unwrap();
    let run_id = format!("bench-run-{id}");
    let mut held = store
        .acquire_writer(AcquireWriter {
            owner_token: None,
            key: key.clone(),
            expected_session: ExpectedSession::Current,
            expected_writer: None,
            run_id: run_id.clone(),
            mode: AcquireMode::Cas,
            label: None,
        })
        .await
        .expect("first acquire");
    let mut latencies = Vec::new();
    // At least one operation each, however late the worker starts (a busy
    // machine may start the last of 32 after the window): no empty sample.
    loop {
        let started = Instant::now();
        match op {
            Op::Append => {
                store
                    .append(AppendEntries {
                        owner_token: None,
                        key: key.clone(),
                        session_id: held.session.session_id,
                        run_id: run_id.clone(),
                        fence_token: held.fence_token,
                        entries: vec![NewEntry {
                            role: "assistant".into(),
                            content_json: r#"[{"type":"text","text":"The quick brown fox jumps over the lazy dog, streaming a reply chunk by chunk."}]"#.into(),
                            timestamp_ms: None,
                            metadata: EntryMetadata::default(),
                        }],
                    })
                    .await
                    .expect("append");
            }
            Op::AcquireWriter => {
                held = store
                    .acquire_writer(AcquireWriter {
                        owner_token: None,
                        key: key.clone(),
                        expected_session: ExpectedSession::Id(held.session.session_id),
                        expected_writer: Some(run_id.clone()),
                        run_id: run_id.clone(),
                        mode: AcquireMode::Cas,
                        label: None,
                    })
                    .await
                    .expect("re-acquire");
            }
        }
        latencies.push(started.elapsed().as_micros() as u64);
        if Instant::now() >= until {
            return latencies;
        }
    }
}

async fn measure(address: &str, op: Op, concurrency: usize, per_case: Duration) -> Sample {
    let mut channels = Vec::new();
    for _ in 0..concurrency.min(4) {
        channels.push(RemoteStore::connect(address).await.unwrap());
    }
    let started = Instant::now();
    let until = started + per_case;
    let tasks: Vec<_> = (0..concurrency)
        .map(|id| tokio::spawn(worker(channels[id % channels.len()].clone(), id, op, until)))
        .collect();
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies_us.sort_unstable();
    Sample {
        ops: latencies_us.len(),
        elapsed,
        latencies_us,
    }
}

async fn bench_backend(name: &str, backend: Arc<dyn SessionStore>, per_case: Duration) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_store(
        backend,
        ServeOptions::default(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    for op in [Op::Append, Op::AcquireWriter] {
        for concurrency in [1, 32] {
            let s = measure(&address, op, concurrency, per_case).await;
            println!(
                "| {name} | {} | {concurrency} | {:.0} | {} | {} |",
                op.name(),
                s.ops as f64 / s.elapsed.as_secs_f64(),
                percentile(&s.latencies_us, 0.50),
                percentile(&s.latencies_us, 0.99),
            );
        }
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::main]
async fn main() {
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let per_case = if benchmarking {
        let seconds = std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        Duration::from_secs(seconds)
    } else {
        println!("(smoke run: the numbers mean nothing; use `cargo bench -p session-store`)");
        Duration::from_millis(100)
    };
    println!("| backend | operation | concurrency | ops/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|---|");

    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::open(&dir.path().join("bench.redb"), EmbeddedOptions::default())
        .await
        .unwrap();
    bench_backend("embedded (redb)", Arc::new(embedded), per_case).await;

    // The tests' PostgreSQL: missing, the run fails (a row never goes
    // silently unmeasured).
    let url = clawgate_system_tests::postgres_url();
    let schema = clawgate_system_tests::postgres::fresh_schema("ssbench");
    let options = PgOptions {
        schema: Some(schema.clone()),
        ..PgOptions::default()
    };
    let pg = PostgresStore::connect(&url, options)
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url}: {e}"));
    bench_backend("PostgreSQL", Arc::new(pg), per_case).await;
    clawgate_system_tests::postgres::drop_schema(&clawgate_system_tests::postgres_url(), &schema)
        .await;
}

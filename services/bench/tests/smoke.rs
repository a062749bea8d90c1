//! The load generator runs and reports, against a real edge, coordinator
//! and store (in process, on port 0). It asserts that every scenario
//! reports its rows, never a time: figures belong in docs/benchmarks.md.

use std::sync::Arc;
use std::time::Duration;

use gateway_edge::config::EdgeConfig;
use gateway_edge::edge::{Backends, Edge};
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "bench-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_reports() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 2,
        pace: Duration::from_millis(1),
    }));
    let services = clawgate_system_tests::local::spawn(
        dir.path(),
        runtime,
        CoordinatorConfig::default(),
        stop.clone(),
    )
    .await
    .unwrap();
    let config = EdgeConfig::with_token(services.coordinator_url, services.store_url, TOKEN);
    let edge = Edge::new(config.clone(), Backends::connect_lazy(&config).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(gateway_edge::server::serve_edge(
        edge.clone(),
        listener,
        stop.clone().cancelled_owned(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the edge never became ready"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let out = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args(["--url", &url, "--token", TOKEN])
        .args(["--connections", "1,3", "--requests", "4"])
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for scenario in ["connect", "health", "chat.send ack", "complete run"] {
        for connections in ["1", "3"] {
            let count = if scenario == "connect" {
                connections.to_owned()
            } else {
                (connections.parse::<usize>().unwrap() * 4).to_string()
            };
            let row = format!("| {scenario} | {connections} | {count} |");
            assert!(printed.contains(&row), "no row {row:?} in\n{printed}");
        }
    }
    // A wrong token is an error, not a report.
    let refused = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args([
            "--url",
            &url,
            "--token",
            "wrong",
            "--connections",
            "1",
            "--requests",
            "1",
        ])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    stop.cancel();
}

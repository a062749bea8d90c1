//! The load generator runs and reports, against a real edge, coordinator
//! and store (in process, on port 0), and beside its floors. It asserts
//! that every scenario reports its rows, never a time: figures belong in
//! docs/benchmarks.md.

mod common;

use std::sync::Arc;
use std::time::Duration;

use clawgate_system_tests::Sandbox;
use clawgate_system_tests::client::TOKEN;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use tokio::process::Command;

use common::{assert_measured, bench};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_reports_beside_its_floor() {
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 2,
        pace: Duration::from_millis(1),
    }));
    let sandbox = Sandbox::builder().runtime(runtime).edges(1).start().await;
    let url = sandbox.edge_url().to_owned();

    // The edge runs in this process: its memory is this process's.
    let pid = std::process::id().to_string();
    let (printed, _) = bench(&[
        "--url",
        &url,
        "--token",
        TOKEN,
        "--scenarios",
        "connect,health,ack,run,fanout,idle",
        "--connections",
        "1,3",
        "--requests",
        "4",
        "--watchers",
        "3",
        "--idle",
        "5",
        "--edge-pid",
        &pid,
        "--echo-pace",
        "1ms",
        "--floors",
    ])
    .await;
    for (scenario, floor) in [
        ("connect", "(a)"),
        ("health", "(a)"),
        ("chat.send ack", "(c)"),
        ("chat.send ack, runs executing", "(c)"),
        ("complete run", "(c)"),
    ] {
        for connections in [1, 3] {
            let count = if scenario == "connect" {
                connections
            } else {
                connections * 4
            };
            let row = assert_measured(&printed, scenario, "gateway", "—", connections);
            assert_eq!(row[4], count.to_string(), "{printed}");
            assert_eq!(row[9], floor, "{printed}");
        }
    }
    let fanout = assert_measured(&printed, "fanout delivery", "gateway", "—", 3);
    assert_eq!(fanout[9], "(a)", "{printed}");
    let idle = assert_measured(&printed, "idle memory", "gateway", "—", 5);
    assert_eq!(idle[4], "5", "{printed}");
    assert!(idle[14].contains("KiB per connection"), "{printed}");
    // The floors themselves.
    for (scenario, floor) in [
        ("connect", "floor (a) ws echo"),
        ("health", "floor (a) ws echo"),
        ("chat.send ack", "floor (b) ws+2 gRPC"),
        ("chat.send ack", "floor (c) ws+2 gRPC+commit"),
        (
            "chat.send ack, runs executing",
            "floor (c) ws+2 gRPC+commit",
        ),
        ("complete run", "floor (c) ws+2 gRPC+commit"),
        ("complete run", "floor (d) (c)+broadcast"),
    ] {
        for connections in [1, 3] {
            let backend = if floor.contains("commit") || floor.contains("(d)") {
                "embedded"
            } else {
                "—"
            };
            assert_measured(&printed, scenario, floor, backend, connections);
        }
    }
    assert_measured(&printed, "fanout delivery", "floor (a) ws echo", "—", 3);

    // A wrong token is an error, not a report.
    let refused = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args(["--url", &url, "--token", "wrong"])
        .args(["--connections", "1", "--requests", "1"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stdout).contains("error: connect refused"));
    sandbox.finish().await;
}

//! An edge whose coordinators all refuse (none started yet, all gone)
//! keeps looking for one at a measured pace: it does not switch between
//! them in a tight loop, burning CPU and writing a log line each time (a
//! real edge did: 22,800 lines in 15 s, 18 % of a core, with two
//! unreachable coordinators).

use std::time::Duration;

use clawgate_system_tests::process::{Process, binary_path, service_command};

#[tokio::test]
async fn an_edge_with_no_reachable_coordinator_searches_at_a_pace() {
    // Ports 9 and 11 (discard, systat) have nobody listening on loopback:
    // every connection is refused at once.
    let mut command = service_command(binary_path("gateway-edge"));
    command.args([
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--coordinator-address",
        "http://127.0.0.1:9,http://127.0.0.1:11",
        "--store-address",
        "http://127.0.0.1:13",
        "--auth-mode",
        "token",
        "--token",
        "unreachable-test-token",
    ]);
    let edge = Process::start(command, "gateway-edge", "gateway edge listening").await;
    // The line is rate-limited (one a second); each carries how many were
    // left out before it (`suppressed=N`), so the switches logged are the
    // lines plus what they say they left out.
    let switches = || {
        edge.output()
            .iter()
            .filter(|line| line.contains("following the run coordinator leader"))
            .map(|line| 1 + suppressed(line))
            .sum::<usize>()
    };
    let before = switches();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = switches() - before;
    // Pauses of 0.1, 0.2, 0.4, 0.8, 1.6 s: at most a handful in 3 s (a
    // slower machine makes fewer).
    assert!(
        during <= 10,
        "{during} switches between unreachable coordinators in 3 s:\n{}",
        edge.output_text()
    );
    assert!(during >= 1, "the edge never looked for another coordinator");
}

/// The `suppressed=N` field of a rate-limited log line (0 without one).
fn suppressed(line: &str) -> usize {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("suppressed="))
        .map_or(0, |n| n.parse().expect("suppressed=N is a number"))
}

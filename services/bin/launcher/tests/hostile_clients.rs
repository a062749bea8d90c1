//! The all-in-one against one address that opens more half-open sockets
//! than the process has file descriptors (issue: 19,500 such sockets once
//! ran the edge out of descriptors, shut good clients out and logged 6.2 GB
//! of `accept failed` in 40 s). The real `clawgate` runs with a low
//! `RLIMIT_NOFILE` (set by `prlimit` before it starts) so that the attack
//! is cheap; the process's descriptors, log and memory are read from
//! outside.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clawgate_system_tests::client::{OPERATOR_SCOPES, TOKEN};
use clawgate_system_tests::process::Process;
use clawgate_system_tests::raw_socket::{connect_from, read_until_closed};
use clawgate_system_tests::{Client, report, wait_for, wait_until};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The all-in-one's descriptor limit in these tests.
const OPEN_FILES: u64 = 512;
/// Half-open sockets the attacker holds: more than the limit allows.
const HALF_OPEN: usize = 1000;
/// The all-in-one's peak resident memory must stay under this (it is
/// about 40 MiB before and after the attack in a debug build).
const PEAK_RSS_BOUND_KIB: u64 = 200 * 1024;
/// What the attack may add to the log.
const LOG_GROWTH_BOUND: usize = 1_000_000;

const HALF_A_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n";

fn ip(raw: &str) -> IpAddr {
    raw.parse().unwrap()
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count())
}

fn log_bytes(process: &Process) -> usize {
    process.output().iter().map(|line| line.len() + 1).sum()
}

/// `count` sockets from 127.0.0.1, each having sent half a request head.
async fn half_open(at: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(count);
    for n in 0..count {
        let mut socket = connect_from(at, ip("127.0.0.1"))
            .await
            .unwrap_or_else(|e| panic!("half-open socket {n}: {e}"));
        // A socket the edge refused may be reset before this is written.
        let _ = socket.write_all(HALF_A_HEAD).await;
        sockets.push(socket);
    }
    sockets
}

/// A client from 127.0.0.2 connects, authenticates and runs a turn.
async fn good_client_runs_a_turn(url: &str, key: &str) -> Client {
    let mut good = Client::connect_from(url, ip("127.0.0.2"), OPERATOR_SCOPES).await;
    let sent = good
        .request(
            "chat.send",
            json!({ "sessionKey": key, "message": "still here?", "idempotencyKey": key }),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    good.chat_end(key).await;
    good
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_sockets_past_the_descriptor_limit_leave_good_clients_served() {
    let data = tempfile::tempdir().unwrap();
    let mut command = common::all_in_one_with_open_files(data.path(), TOKEN, OPEN_FILES);
    command.env("EDGE_HEADER_READ_TIMEOUT", "2s");
    let clawgate = common::start(command).await;
    let pid = clawgate.pid().expect("running");
    let limit = clawgate_common::process::procfs::open_files_limit(Some(pid)).unwrap();
    assert_eq!(limit, (OPEN_FILES, OPEN_FILES));
    let url = format!("ws://{}", clawgate.address);
    let descriptors_before = open_descriptors(pid);
    let log_before = log_bytes(&clawgate);

    let mut attack = half_open(clawgate.address, HALF_OPEN).await;
    let held = open_descriptors(pid);
    assert!(
        held < OPEN_FILES as usize,
        "{held} descriptors open with {HALF_OPEN} half-open sockets"
    );
    // Meanwhile a good client from another address is served.
    let mut good = good_client_runs_a_turn(&url, "during-the-attack").await;

    // The edge closes every one of them: those over the per-address cap at
    // once, the others when their head is overdue.
    for socket in &mut attack {
        read_until_closed(socket).await;
    }
    wait_until(
        "the half-open sockets' descriptors to be closed",
        Duration::from_secs(30),
        || open_descriptors(pid) <= descriptors_before + 1,
    )
    .await;
    let health = good.request("health", json!({})).await;
    assert_eq!(health["ok"], true, "{health}");
    drop(good_client_runs_a_turn(&url, "after-the-attack").await);

    let grown = log_bytes(&clawgate) - log_before;
    let peak_kib = clawgate.status_kib("VmHWM").expect("the peak RSS");
    report(&format!(
        "hostile clients: {HALF_OPEN} half-open sockets against RLIMIT_NOFILE {OPEN_FILES}: \
         at most {held} descriptors open (before: {descriptors_before}), log +{grown} bytes, \
         peak RSS {} MiB",
        peak_kib / 1024
    ));
    assert!(grown < LOG_GROWTH_BOUND, "the log grew {grown} bytes");
    assert!(
        peak_kib < PEAK_RSS_BOUND_KIB,
        "peak RSS {peak_kib} KiB is over {PEAK_RSS_BOUND_KIB} KiB"
    );
}

/// With the socket caps lifted past the descriptor limit, accepts fail
/// (`EMFILE`): the loop backs off, logs a line a second at most, and the
/// edge recovers once the head timeout has closed the sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_failures_back_off_and_are_logged_a_line_a_second() {
    let data = tempfile::tempdir().unwrap();
    let mut command = common::all_in_one_with_open_files(data.path(), TOKEN, 256);
    command
        .env("EDGE_HEADER_READ_TIMEOUT", "3s")
        .env("EDGE_MAX_SOCKETS", "100000")
        .env("EDGE_SOCKETS_PER_IP", "100000");
    let clawgate = common::start(command).await;
    let url = format!("ws://{}", clawgate.address);
    let log_before = log_bytes(&clawgate);
    let started = tokio::time::Instant::now();

    let _attack = half_open(clawgate.address, 400).await;
    let failures = |process: &Process| {
        process
            .output()
            .iter()
            .filter(|line| line.contains("accept failed"))
            .count()
    };
    wait_until("accepts to fail", Duration::from_secs(30), || {
        failures(&clawgate) > 0
    })
    .await;
    // Once the head timeout frees descriptors, a good client gets in (the
    // attack's sockets still queued take their turn too).
    wait_for(
        "a good client to be served",
        Duration::from_secs(60),
        async || {
            let attempt = tokio::time::timeout(Duration::from_secs(5), async {
                let mut client = Client::open_from(&url, ip("127.0.0.2")).await.ok()?;
                client.handshake(OPERATOR_SCOPES).await;
                let health = client.request("health", json!({})).await;
                (health["ok"] == true).then_some(())
            });
            attempt.await.ok().flatten().ok_or("not yet")
        },
    )
    .await;
    let elapsed = started.elapsed().as_secs() as usize;
    let lines = failures(&clawgate);
    let grown = log_bytes(&clawgate) - log_before;
    report(&format!(
        "accept failures: {lines} log lines in {elapsed} s, log +{grown} bytes"
    ));
    assert!(
        lines <= elapsed + 2,
        "{lines} accept-failure lines in {elapsed} s:\n{}",
        clawgate.output_text()
    );
    assert!(
        clawgate.output().iter().any(|l| l.contains("suppressed")),
        "the lines carry the count of those left out"
    );
    assert!(grown < LOG_GROWTH_BOUND, "the log grew {grown} bytes");
}

//! The bench always reports: each row is printed (and appended to `--out`)
//! the moment its scenario ends, and a scenario that cannot finish before
//! its deadline still prints its row, saying how far it got. Against a real
//! edge whose runs never end (the echo runtime paced at an hour a piece).

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clawgate_system_tests::Sandbox;
use clawgate_system_tests::client::TOKEN;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use common::table_rows;

/// A sandbox whose runs start and never end.
async fn endless_runs() -> Sandbox {
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 2,
        pace: Duration::from_secs(3600),
    }));
    Sandbox::builder().runtime(runtime).edges(1).start().await
}

/// A path for `--out` in a directory of its own, gone with the directory.
fn out_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("table.md").to_str().unwrap().to_owned();
    (dir, out)
}

fn bench_args<'a>(url: &'a str, timeout: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--url",
        url,
        "--token",
        TOKEN,
        "--scenarios",
        "health,run",
        "--connections",
        "1",
        "--requests",
        "2",
        "--scenario-timeout",
        timeout,
        "--out",
        out,
    ]
}

fn row<'a>(rows: &'a [Vec<String>], scenario: &str) -> &'a [String] {
    rows.iter()
        .find(|cells| cells.len() == 15 && cells[0] == scenario)
        .unwrap_or_else(|| panic!("no {scenario} row in {rows:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_cut_off_by_its_deadline_still_prints_its_row() {
    let sandbox = endless_runs().await;
    let (_dir, out) = out_file();
    let out = out.as_str();
    let ran = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args(bench_args(sandbox.edge_url(), "2s", out))
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&ran.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&ran.stderr);
    // A row not measured in full is a failure of the run, reported.
    assert!(!ran.status.success(), "{printed}{stderr}");
    assert!(stderr.contains("could not be measured in full"), "{stderr}");
    let rows = table_rows(&printed);
    assert_eq!(row(&rows, "health")[4], "2", "{printed}");
    // The warm-up send and two counted ones planned; the first never ends.
    for scenario in ["complete run", "chat.send ack, runs executing"] {
        let cut = row(&rows, scenario);
        assert_eq!(cut[4], "0", "{printed}");
        assert!(
            cut[14].contains("incomplete: the 2s deadline came: 0 of 3 requests answered"),
            "{printed}"
        );
    }
    // The file has every line printed.
    let written = std::fs::read_to_string(out).unwrap();
    assert_eq!(written, printed);
    sandbox.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_is_printed_when_its_scenario_ends() {
    let sandbox = endless_runs().await;
    let (_dir, out) = out_file();
    let out = out.as_str();
    // `run` cannot end before its deadline, an hour away: the health row
    // can only be read now if it was printed when health ended.
    let mut bench = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args(bench_args(sandbox.edge_url(), "1h", out))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bench.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let health = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the bench ended without a health row:\n{printed}"));
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("| health |") {
            break line;
        }
    };
    assert!(printed.starts_with("| scenario |"), "{printed}");
    assert_eq!(row(&table_rows(&health), "health")[4], "2", "{health}");
    // Appended to the file as it was printed, while the bench runs on.
    let written = std::fs::read_to_string(out).unwrap();
    assert_eq!(written, printed);
    assert!(
        bench.try_wait().unwrap().is_none(),
        "the bench is still running"
    );
    bench.kill().await.unwrap();
    sandbox.finish().await;
}

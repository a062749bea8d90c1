//! What the bench's tests share: running the bench, finding its rows.
//! (Each test binary uses a part of it.)
#![allow(dead_code)]

use tokio::process::Command;

/// Runs `clawgate-bench` with `args`; its table and its stderr, after
/// checking that it succeeded.
pub async fn bench(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_clawgate-bench"))
        .args(args)
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{printed}{stderr}");
    (printed, stderr)
}

/// The cells of the row for `scenario` on `topology` and `backend` at
/// `connections`; asserts that there is one and that it measured
/// something (a count, not an error).
pub fn assert_measured(
    printed: &str,
    scenario: &str,
    topology: &str,
    backend: &str,
    connections: impl ToString,
) -> Vec<String> {
    let connections = connections.to_string();
    let row = table_rows(printed)
        .into_iter()
        .find(|cells| {
            cells.len() == 15
                && cells[0] == scenario
                && cells[1] == topology
                && cells[2] == backend
                && cells[3] == connections
        })
        .unwrap_or_else(|| {
            panic!("no row {scenario} | {topology} | {backend} | {connections} in\n{printed}")
        });
    assert!(
        row[4].parse::<usize>().is_ok_and(|n| n > 0),
        "{scenario} on {topology} measured nothing:\n{printed}"
    );
    row
}

/// The cells of every line of `printed` that is a Markdown table row.
pub fn table_rows(printed: &str) -> Vec<Vec<String>> {
    printed
        .lines()
        .filter(|line| line.starts_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

//! `clawgate-bench scale` starts the real binaries (the ones cargo built
//! beside this test: `cargo build --bins` when run alone) with one and two
//! balanced coordinators, tiny and short, and reports a row for each with
//! its runs, the partitions spread over both, and the scaling factor. It
//! asserts rows, never a time.

mod common;

use common::{bench, table_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_reports_runs_per_second_for_each_coordinator_count() {
    let store = clawgate_system_tests::process::binary_path("session-store");
    for service in ["run-coordinator", "gateway-edge"] {
        clawgate_system_tests::process::binary_path(service);
    }
    let bin_dir = store.parent().unwrap().to_string_lossy().into_owned();
    let (printed, _) = bench(&[
        "scale",
        "--bin-dir",
        &bin_dir,
        "--coordinators",
        "1,2",
        "--partitions",
        "32",
        "--sessions",
        "4",
        "--warmup",
        "300ms",
        "--duration",
        "1s",
        "--alone-runs",
        "1",
        "--max-executing",
        "2",
        "--echo-chunks",
        "2",
        "--echo-pace",
        "5ms",
    ])
    .await;
    let rows: Vec<Vec<String>> = table_rows(&printed)
        .into_iter()
        .filter(|cells| cells.len() == 13 && cells[0].parse::<usize>().is_ok())
        .collect();
    assert_eq!(rows.len(), 2, "{printed}");
    for (row, coordinators) in rows.iter().zip([1, 2]) {
        assert_eq!(row[0], coordinators.to_string(), "{printed}");
        // Every partition held, by as many coordinators as started.
        let held: Vec<usize> = row[1].split(" / ").map(|n| n.parse().unwrap()).collect();
        assert_eq!(held.len(), coordinators, "{printed}");
        assert!(held.iter().all(|&n| n > 0), "{printed}");
        assert_eq!(held.iter().sum::<usize>(), 32, "{printed}");
        let sessions: usize = row[2]
            .split(" / ")
            .map(|n| n.parse::<usize>().unwrap())
            .sum();
        assert_eq!(sessions, 4, "{printed}");
        assert!(row[4].parse::<usize>().unwrap() > 0, "no runs:\n{printed}");
        for figure in [&row[5], &row[9], &row[10], &row[11]] {
            assert!(figure.parse::<f64>().is_ok(), "{figure:?} in\n{printed}");
        }
    }
    assert_eq!(rows[0][11], "1.00", "{printed}");
}

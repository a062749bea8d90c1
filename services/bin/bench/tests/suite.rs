//! `clawgate-bench suite` starts the real binaries (the ones cargo built
//! beside this test: `cargo build --bins` when run alone) in both
//! topologies on both backends, tiny, and reports every row with its
//! floor; the PostgreSQL databases it made are gone after. It asserts
//! rows, never a time.

mod common;

use common::{assert_measured, bench};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_reports_every_scenario_on_every_system() {
    let clawgate = clawgate_system_tests::process::binary_path("clawgate");
    for service in ["session-store", "run-coordinator", "gateway-edge"] {
        clawgate_system_tests::process::binary_path(service);
    }
    let bin_dir = clawgate.parent().unwrap().to_string_lossy().into_owned();
    let postgres = clawgate_system_tests::postgres_url();
    let (printed, stderr) = bench(&[
        "suite",
        "--bin-dir",
        &bin_dir,
        "--postgres-url",
        &postgres,
        "--connections",
        "2",
        "--requests",
        "2",
        "--watchers",
        "3",
        "--idle",
        "5",
        "--startup-runs",
        "2",
        "--echo-pace",
        "1ms",
    ])
    .await;
    for backend in ["embedded", "postgres"] {
        for topology in ["all-in-one", "split"] {
            let scenarios = [
                "connect",
                "health",
                "chat.send ack",
                "chat.send ack, runs executing",
                "complete run",
            ];
            for scenario in scenarios {
                assert_measured(&printed, scenario, topology, backend, 2);
            }
            assert_measured(&printed, "fanout delivery", topology, backend, 3);
            assert_measured(&printed, "idle memory", topology, backend, 5);
        }
        let startup = assert_measured(&printed, "startup", "all-in-one", backend, "—");
        assert_eq!(startup[4], "2", "{printed}");
    }
    let floor = "floor (c) ws+2 gRPC+commit";
    assert_measured(&printed, "chat.send ack", floor, "embedded", 2);

    // Each system on PostgreSQL had a database of its own, dropped after.
    let created: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("created database "))
        .collect();
    assert_eq!(created.len(), 2 + 2, "{stderr}");
    let (client, connection) = tokio_postgres::connect(&postgres, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for name in created {
        let left = client
            .query("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .await
            .unwrap();
        assert!(left.is_empty(), "database {name} was not dropped");
    }
}

/// The split topology with its gRPC hops over TLS and over mutual TLS
/// (test certificates the bench makes) measures the ACK as the plaintext
/// one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_topology_runs_over_tls_and_mutual_tls() {
    let gateway = clawgate_system_tests::process::binary_path("gateway-edge");
    for service in ["session-store", "run-coordinator"] {
        clawgate_system_tests::process::binary_path(service);
    }
    let bin_dir = gateway.parent().unwrap().to_string_lossy().into_owned();
    let (printed, _) = bench(&[
        "suite",
        "--bin-dir",
        &bin_dir,
        "--backends",
        "embedded",
        "--topologies",
        "split-tls,split-mtls",
        "--scenarios",
        "ack",
        "--connections",
        "2",
        "--requests",
        "2",
    ])
    .await;
    for topology in ["split-tls", "split-mtls"] {
        assert_measured(&printed, "chat.send ack", topology, "embedded", 2);
    }
}

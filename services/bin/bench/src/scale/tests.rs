//! The scale table and the spread check, on made-up figures.

use super::*;

fn lease(partition: u32, owner: &str, address: &str) -> store_pb::Lease {
    store_pb::Lease {
        partition,
        owner: Some(owner.into()),
        address: address.into(),
        epoch: 1,
        expires_at_ms: 2_000,
    }
}

#[test]
fn placement_has_converged_only_where_rendezvous_puts_every_partition() {
    let members = [("a", "http://x"), ("b", "http://y")];
    let placed = |partition: u32| {
        let winner = rendezvous_owner(partition, &["a", "b"]).unwrap();
        let (owner, address) = members.iter().find(|(m, _)| *m == winner).unwrap();
        lease(partition, owner, address)
    };
    let mut table = store_pb::ListLeasesResponse {
        partition_count: 16,
        leases: (0..16).map(placed).collect(),
        now_ms: 1_000,
    };
    let both = ["http://x".to_owned(), "http://y".to_owned()];
    assert!(spread_over(&table, &both));
    assert!(!spread_over(&table, &both[..1]));
    // One partition still on the loser (a move not done yet).
    let moved = table
        .leases
        .iter()
        .position(|l| l.owner.as_deref() == Some("b"));
    let moved = moved.unwrap();
    table.leases[moved] = lease(moved as u32, "a", "http://x");
    assert!(!spread_over(&table, &both));
    // An expired lease is not held.
    table.leases[moved] = store_pb::Lease {
        expires_at_ms: 900,
        ..placed(moved as u32)
    };
    assert!(!spread_over(&table, &both));
}

#[test]
fn a_message_is_streamed_back_in_exactly_the_chunks_asked_for() {
    for chunks in [1, 4, 10] {
        let text = message(chunks, 12_345);
        assert_eq!(text.chars().count(), chunks * 8);
        assert_eq!(text.len().div_ceil(text.len().div_ceil(chunks)), chunks);
    }
}

#[test]
fn the_table_has_the_scaling_factor_and_the_ideal() {
    let stats = |rate: f64| Stats {
        count: (rate * 10.0) as usize,
        p50: Duration::from_millis(100),
        p90: Duration::from_millis(150),
        p99: Duration::from_millis(200),
        max: Duration::from_millis(300),
        rate,
    };
    let measured = |n: usize, rate: f64| Measured {
        partitions: vec![256 / n; n],
        sessions: vec![64 / n; n],
        alone: Duration::from_millis(250),
        load: stats(rate),
        cpu: Some(CpuShare {
            machine: 0.5,
            services: 0.25,
            bench: 0.1,
        }),
    };
    let plan = ScalePlan {
        bin_dir: PathBuf::new(),
        backend: Backend::Embedded,
        coordinators: vec![1, 2],
        edges: 1,
        sessions: 64,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(10),
        alone_runs: 1,
        partitions: None,
        lease_ttl: Duration::from_secs(2),
        lease_renew: Duration::from_millis(400),
        settings: Settings {
            echo: crate::plan::Echo::default(),
            token: String::new(),
            max_connections: 1,
            preauth_per_ip: 1,
            max_executing: Some(4),
        },
        session_prefix: "b".into(),
    };
    let rows = [
        ScaleRow {
            coordinators: 1,
            outcome: Ok(measured(1, 15.0)),
        },
        ScaleRow {
            coordinators: 2,
            outcome: Ok(measured(2, 27.0)),
        },
        ScaleRow {
            coordinators: 3,
            outcome: Err("it | broke".into()),
        },
    ];
    let printed = table(&plan, &rows);
    assert!(
        printed.contains(
            "| 1 | 256 | 64 | 250.00 | 150 | 15.0 | 100.00 | 200.00 | 300.00 | 16.0 | 0.94 | 1.00 | 50% / 25% / 10% |"
        ),
        "{printed}"
    );
    assert!(
        printed.contains("| 2 | 128 / 128 | 32 / 32 | 250.00 | 270 | 27.0 |"),
        "{printed}"
    );
    assert!(printed.contains("| 32.0 | 0.84 | 1.80 |"), "{printed}");
    assert!(printed.contains("| 3 | — |"), "{printed}");
    assert!(printed.contains("error: it \\| broke |"), "{printed}");
}

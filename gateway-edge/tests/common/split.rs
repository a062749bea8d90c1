//! Coordinators that share the partitions, in this process: a sandbox on
//! the memory store with a few partitions and lease ownership, whose
//! coordinators each test starts itself; and the edge's view of them.

use clawgate_system_tests::sandbox::{Backend, Ownership, Sandbox, SandboxEdge};
use gateway_edge::Edge;
use run_coordinator::ownership::Placement;

use super::{DEADLINE, wait_until};

/// A store with `partitions` partitions and no coordinator yet; the
/// coordinators started on it hold leases (all on one, unless a test asks
/// for balanced placement).
pub async fn split(partitions: u32) -> Sandbox {
    Sandbox::builder()
        .backend(Backend::Memory)
        .partitions(partitions)
        .ownership(Ownership::Lease(Placement::AllOnOne))
        .coordinators(0)
        .start()
        .await
}

/// Starts an edge of `split` seeded with `coordinators`; its URL and state
/// once it follows `streams` coordinators' event streams, all open.
pub async fn edge_following(split: &Sandbox, coordinators: &str, streams: usize) -> SandboxEdge {
    let (url, edge) = split.edge(split.edge_config_for(coordinators)).await;
    until_streams(&edge, streams).await;
    (url, edge)
}

/// Waits until the edge follows `streams` coordinators' event streams, all
/// open.
pub async fn until_streams(edge: &Edge, streams: usize) {
    let what = format!("the edge to follow {streams} streams");
    wait_until(what, DEADLINE, || {
        let routes = edge.backends.coordinator.routes();
        let now = tokio::time::Instant::now();
        let wanted = routes.stream_addresses(now);
        let ready = edge.fanout_ready.load(std::sync::atomic::Ordering::Relaxed);
        if wanted.len() == streams && ready {
            return Ok(());
        }
        // Each partition's owner as the edge last heard, and how long its
        // lease has left (negative: lapsed), to tell a stale map apart.
        let owners: Vec<String> = (0..routes.map.partition_count())
            .map(|p| match routes.map.owner(p) {
                Some(o) => {
                    let left = o.expires.saturating_duration_since(now).as_millis() as i128
                        - now.saturating_duration_since(o.expires).as_millis() as i128;
                    format!("{p}:{}@{} {left}ms", o.member, o.address)
                }
                None => format!("{p}:-"),
            })
            .collect();
        Err(format!(
            "it wants {wanted:?} (ready: {ready}); owners {owners:?}"
        ))
    })
    .await;
}

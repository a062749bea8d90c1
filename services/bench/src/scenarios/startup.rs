//! `startup`: the all-in-one from spawn to ready (see the crate's
//! documentation).

use std::path::Path;

use tokio::time::Instant;

use super::Target;
use crate::procs::{EDGE_READY, Service, Settings, all_in_one, until_ready};
use crate::stores::Backend;
use crate::{Outcome, Row, Scenario, Stats};

/// `runs` starts of the `clawgate` at `binary`, each on a fresh store of
/// `backend`; the row is labelled all-in-one on that backend.
pub async fn measure(binary: &Path, runs: usize, backend: &Backend, settings: &Settings) -> Row {
    let target = Target::new("all-in-one", backend.name());
    let (outcome, note) = match starts(binary, runs, backend, settings).await {
        Ok(stats) => (
            Outcome::Latency(stats),
            "spawn → /readyz 200, fresh store each".to_owned(),
        ),
        Err(e) => (Outcome::Failed(format!("{e:#}")), String::new()),
    };
    target.row(Scenario::Startup, None, outcome, note)
}

async fn starts(
    binary: &Path,
    runs: usize,
    backend: &Backend,
    settings: &Settings,
) -> anyhow::Result<Stats> {
    let mut samples = Vec::with_capacity(runs);
    let mut wall = std::time::Duration::ZERO;
    for _ in 0..runs {
        let store = backend.fresh().await?;
        let started = Instant::now();
        let command = all_in_one(binary, &store.location, settings);
        let up = async {
            let service = Service::start(command, "clawgate", EDGE_READY).await?;
            let ready = until_ready(service.address).await;
            let took = started.elapsed();
            service.stop().await?;
            ready.map(|()| took)
        };
        let took = up.await;
        store.remove().await?;
        let took = took?;
        wall += took;
        samples.push(took);
    }
    Ok(Stats::of(samples, wall))
}

//! `startup`: the all-in-one from spawn to ready (see the crate's
//! documentation).

use std::path::Path;

use tokio::time::Instant;

use super::{Target, within_deadline};
use crate::plan::{Plan, Scenario};
use crate::procs::{EDGE_READY, Settings, all_in_one, start_service, stop_service, until_ready};
use crate::progress::Progress;
use crate::stats::Stats;
use crate::stores::Backend;
use crate::table::{Outcome, Row};

/// `runs` starts of the `clawgate` at `binary`, each on a fresh store of
/// `backend`; the row is labelled all-in-one on that backend.
/// Within `plan`'s deadline for one scenario.
pub async fn measure(
    plan: &Plan,
    binary: &Path,
    runs: usize,
    backend: &Backend,
    settings: &Settings,
) -> Row {
    let target = Target::new("all-in-one", backend.name());
    let progress = Progress::default();
    let started = starts(binary, runs, backend, settings, &progress);
    let note = "spawn → /readyz 200, fresh store each".to_owned();
    let (outcome, note) = match within_deadline(plan, &progress, started).await {
        Ok(Ok(stats)) => (Outcome::Latency(stats), note),
        Ok(Err(e)) => (Outcome::Failed(format!("{e:#}")), String::new()),
        Err(why) => (Outcome::Incomplete(progress.stats().0, why), note),
    };
    target.row(Scenario::Startup, None, outcome, note)
}

async fn starts(
    binary: &Path,
    runs: usize,
    backend: &Backend,
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<Stats> {
    progress.stage("starts", runs);
    progress.start_load();
    let mut samples = Vec::with_capacity(runs);
    let mut wall = std::time::Duration::ZERO;
    for _ in 0..runs {
        let store = backend.fresh().await?;
        let started = Instant::now();
        let command = all_in_one(binary, &store.location, settings);
        let up = async {
            let service = start_service(command, "clawgate", EDGE_READY).await?;
            let ready = until_ready(service.address).await;
            let took = started.elapsed();
            stop_service(service).await?;
            ready.map(|()| took)
        };
        let took = up.await;
        store.remove().await?;
        let took = took?;
        wall += took;
        samples.push(took);
        progress.advance();
        progress.sample(started, took, None);
    }
    Ok(Stats::of(samples, wall))
}

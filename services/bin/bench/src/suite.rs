//! `clawgate-bench suite`: the whole table in one command. First, with
//! nothing else running, it measures the floors (so that every row after is
//! printed beside its floor). Then for each backend (the embedded store in a
//! temp directory; PostgreSQL in a fresh database `clawgate_bench_<uuid>`,
//! dropped after) and each topology (the all-in-one `clawgate`; split:
//! `session-store`, `run-coordinator`, `gateway-edge`, each its own
//! process), it starts the real binaries from `--bin-dir` on port 0 with the
//! echo runtime, runs every gateway scenario against the edge and stops them
//! (SIGTERM, SIGKILL after a deadline, on error too); then it measures
//! `startup` on that backend. Each row goes to the report as it is measured.

use std::path::PathBuf;

use crate::plan::{Plan, Scenario};
use crate::procs::{Settings, System, Topology, binary};
use crate::report::Report;
use crate::scenarios::{Target, startup};
use crate::stores::Backend;
use crate::table::{Outcome, Row};
use crate::{floor, scenarios};

/// What the suite runs.
#[derive(Debug, Clone)]
pub struct SuitePlan {
    /// The scenarios and their sizes (`url`, `token` and `edge_pid` are
    /// set per topology).
    pub load: Plan,
    /// Where the service binaries are.
    pub bin_dir: PathBuf,
    pub topologies: Vec<Topology>,
    pub backends: Vec<Backend>,
    pub settings: Settings,
    /// Starts measured by `startup`.
    pub startup_runs: usize,
}

/// The floors' rows, then the rows of every topology on every backend, to
/// `report` as they are measured.
pub async fn run(plan: &SuitePlan, report: &Report) {
    eprintln!("measuring the floors");
    floor::measure(&plan.load, plan.settings.echo, &|row| report.floor(row)).await;
    let emit = |row| report.row(row);
    for backend in &plan.backends {
        for &topology in &plan.topologies {
            on_topology(plan, topology, backend, &emit).await;
        }
        if plan.load.scenarios.contains(&Scenario::Startup) {
            eprintln!("startup on {}", backend.name());
            emit(match binary(&plan.bin_dir, "clawgate") {
                Ok(clawgate) => {
                    let (runs, settings) = (plan.startup_runs, &plan.settings);
                    startup::measure(&plan.load, &clawgate, runs, backend, settings).await
                }
                Err(e) => Target::new("all-in-one", backend.name()).row(
                    Scenario::Startup,
                    None,
                    Outcome::Failed(format!("{e:#}")),
                    "",
                ),
            });
        }
    }
}

/// Every gateway scenario against `topology` on a fresh `backend` store.
async fn on_topology(
    plan: &SuitePlan,
    topology: Topology,
    backend: &Backend,
    emit: &(dyn Fn(Row) + Sync),
) {
    let scenarios: Vec<Scenario> = plan
        .load
        .scenarios
        .iter()
        .copied()
        .filter(|&s| s != Scenario::Startup)
        .collect();
    if scenarios.is_empty() {
        return;
    }
    let target = Target::new(topology.name(), backend.name());
    let failed = |e: anyhow::Error| {
        for &s in &scenarios {
            emit(target.row(s, None, Outcome::Failed(format!("{e:#}")), ""));
        }
    };
    eprintln!("{} on {}", topology.name(), backend.name());
    let store = match backend.fresh().await {
        Ok(store) => store,
        Err(e) => return failed(e),
    };
    let started = System::start(topology, &plan.bin_dir, &store.location, &plan.settings).await;
    match started {
        Err(e) => failed(e.context(format!("starting {}", topology.name()))),
        Ok(system) => {
            let load = Plan {
                url: system.url.clone(),
                token: plan.settings.token.clone(),
                edge_pid: Some(system.edge_pid),
                scenarios: scenarios.clone(),
                ..plan.load.clone()
            };
            scenarios::run(&load, &target, emit).await;
            if let Err(e) = system.stop().await {
                eprintln!("warning: {e:#}");
            }
        }
    }
    if let Err(e) = store.remove().await {
        eprintln!("warning: removing the store: {e:#}");
    }
}

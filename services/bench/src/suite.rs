//! `clawgate-bench suite`: the whole table in one command. For each
//! backend (the embedded store in a temp directory; PostgreSQL in a fresh
//! database `clawgate_bench_<uuid>`, dropped after) and each topology (the
//! all-in-one `clawgate`; split: `session-store`, `run-coordinator`,
//! `gateway-edge`, each its own process), it starts the real binaries from
//! `--bin-dir` on port 0 with the echo runtime, runs every gateway scenario
//! against the edge and stops them (SIGTERM, SIGKILL after a deadline, on
//! error too); then it measures `startup` on that backend. Last, with
//! nothing else running, it measures the floors once.

use std::path::PathBuf;

use crate::procs::{Settings, System, Topology, binary};
use crate::scenarios::{Target, startup};
use crate::stores::Backend;
use crate::{Outcome, Plan, Row, Scenario, floor, scenarios};

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

/// The rows of every topology on every backend, and the floors' rows.
pub async fn run(plan: &SuitePlan) -> (Vec<Row>, Vec<Row>) {
    let mut rows = Vec::new();
    for backend in &plan.backends {
        for &topology in &plan.topologies {
            rows.extend(on_topology(plan, topology, backend).await);
        }
        if plan.load.scenarios.contains(&Scenario::Startup) {
            eprintln!("startup on {}", backend.name());
            rows.push(match binary(&plan.bin_dir, "clawgate") {
                Ok(clawgate) => {
                    startup::measure(&clawgate, plan.startup_runs, backend, &plan.settings).await
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
    eprintln!("measuring the floors");
    let floors = floor::measure(&plan.load, plan.settings.echo).await;
    (rows, floors)
}

/// Every gateway scenario against `topology` on a fresh `backend` store.
async fn on_topology(plan: &SuitePlan, topology: Topology, backend: &Backend) -> Vec<Row> {
    let scenarios: Vec<Scenario> = plan
        .load
        .scenarios
        .iter()
        .copied()
        .filter(|&s| s != Scenario::Startup)
        .collect();
    if scenarios.is_empty() {
        return Vec::new();
    }
    let target = Target::new(topology.name(), backend.name());
    let failed = |e: anyhow::Error| -> Vec<Row> {
        scenarios
            .iter()
            .map(|&s| target.row(s, None, Outcome::Failed(format!("{e:#}")), ""))
            .collect()
    };
    eprintln!("{} on {}", topology.name(), backend.name());
    let store = match backend.fresh().await {
        Ok(store) => store,
        Err(e) => return failed(e),
    };
    let started = System::start(topology, &plan.bin_dir, &store.location, &plan.settings).await;
    let rows = match started {
        Err(e) => failed(e.context(format!("starting {}", topology.name()))),
        Ok(system) => {
            let load = Plan {
                url: system.url.clone(),
                token: plan.settings.token.clone(),
                edge_pid: Some(system.edge_pid),
                scenarios,
                ..plan.load.clone()
            };
            let rows = scenarios::run(&load, &target).await;
            if let Err(e) = system.stop().await {
                eprintln!("warning: {e:#}");
            }
            rows
        }
    };
    if let Err(e) = store.remove().await {
        eprintln!("warning: removing the store: {e:#}");
    }
    rows
}

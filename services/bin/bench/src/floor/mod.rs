//! The floors: what the same client measures against servers that do only
//! the unavoidable part of each path (see the crate's documentation). They
//! run in this process, on a tokio runtime of their own with two workers,
//! every listener on port 0.

pub mod commit;
pub mod grpc;
pub mod ws;

use std::sync::Arc;

use anyhow::Context;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use tokio::net::TcpListener;

use crate::plan::{Echo, FloorKind, Plan, Scenario};
use crate::scenarios::Target;
use crate::table::{Outcome, Row};

/// The floor servers, running.
pub struct Floors {
    runtime: Option<tokio::runtime::Runtime>,
    urls: Vec<(FloorKind, String)>,
    _dir: tempfile::TempDir,
}

impl Drop for Floors {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Floors {
    /// Starts the four floors (their WebSocket URLs in [`url`](Self::url)).
    pub async fn start(echo: Echo) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("floor")
            .enable_all()
            .build()?;
        let dir = tempfile::Builder::new()
            .prefix("clawgate-bench-floor-")
            .tempdir()?;
        let path = dir.path().join("floor.redb");
        let urls = runtime
            .spawn(async move { start_servers(echo, &path).await })
            .await
            .context("starting the floors")??;
        Ok(Self {
            runtime: Some(runtime),
            urls,
            _dir: dir,
        })
    }

    pub fn url(&self, kind: FloorKind) -> &str {
        let (_, url) = self
            .urls
            .iter()
            .find(|(k, _)| *k == kind)
            .expect("every floor runs");
        url
    }
}

async fn listener() -> anyhow::Result<(TcpListener, std::net::SocketAddr)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    Ok((listener, address))
}

/// Starts B (empty and committing), A in front of each, and the four
/// WebSocket servers; on the floor runtime.
async fn start_servers(
    echo: Echo,
    path: &std::path::Path,
) -> anyhow::Result<Vec<(FloorKind, String)>> {
    let committer = Arc::new(commit::Committer::open(path)?);
    // Every partition held at epoch 1, as by a static coordinator that took
    // them all once: the tokens A sends are the size of real ones.
    let ownership = Arc::new(grpc::Ownership {
        member: uuid::Uuid::new_v4().simple().to_string(),
        epochs: vec![1; clawgate_common::partition::DEFAULT_PARTITIONS as usize],
    });

    let mut urls = Vec::new();
    for kind in FloorKind::ALL {
        let coordinator = match kind {
            FloorKind::Echo => None,
            FloorKind::Grpc | FloorKind::Commit | FloorKind::Broadcast => {
                let commits = matches!(kind, FloorKind::Commit | FloorKind::Broadcast);
                let committer = commits.then(|| committer.clone());
                let (b, b_address) = listener().await?;
                tokio::spawn(grpc::serve(grpc::Recorder { committer }, b));
                let (a, a_address) = listener().await?;
                let submitter = grpc::Submitter {
                    store: SessionStoreClient::new(grpc::channel(b_address)?),
                    ownership: ownership.clone(),
                };
                tokio::spawn(grpc::serve(submitter, a));
                Some(RunCoordinatorClient::new(grpc::channel(a_address)?))
            }
        };
        let (socket, address) = listener().await?;
        let broadcast = matches!(kind, FloorKind::Echo | FloorKind::Broadcast);
        tokio::spawn(ws::serve(
            ws::Hub::new(echo, coordinator, broadcast),
            socket,
        ));
        urls.push((kind, format!("ws://{address}")));
    }
    Ok(urls)
}

/// Measures, on each floor, the scenarios of `plan` it measures, with the
/// same client and settings as the real ones, each row to `emit` as it is
/// measured. A floor that cannot start is an error row per scenario it
/// would have measured.
pub async fn measure(plan: &Plan, echo: Echo, emit: &(dyn Fn(Row) + Sync)) {
    let floors = Floors::start(echo).await;
    for kind in FloorKind::ALL {
        let scenarios: Vec<Scenario> = plan
            .scenarios
            .iter()
            .copied()
            .filter(|&s| kind.measures(s))
            .collect();
        if scenarios.is_empty() {
            continue;
        }
        let target = Target::new(kind.topology(), kind.backend());
        match &floors {
            Ok(floors) => {
                let on_floor = Plan {
                    url: floors.url(kind).to_owned(),
                    scenarios,
                    edge_pid: None,
                    ..plan.clone()
                };
                crate::scenarios::run(&on_floor, &target, emit).await;
            }
            Err(e) => {
                for s in scenarios {
                    emit(target.row(s, None, Outcome::Failed(format!("{e:#}")), ""));
                }
            }
        }
    }
}

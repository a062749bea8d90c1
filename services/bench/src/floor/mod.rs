//! The floors: what the same client measures against servers that do only
//! the unavoidable part of each path (see the crate's documentation). They
//! run in this process, on a tokio runtime of their own with two workers,
//! every listener on port 0.

pub mod grpc;
pub mod ws;

use std::sync::Arc;

use anyhow::Context;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use session_store::SessionStore;
use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store_api::model::AcquireLeases;
use tokio::net::TcpListener;

use crate::scenarios::Target;
use crate::{Echo, Outcome, Plan, Row, Scenario};

/// One of the floors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorKind {
    /// (a) a bare WebSocket server.
    Echo,
    /// (b) WebSocket → gRPC A → gRPC B, empty handlers.
    Grpc,
    /// (c) (b) with a durable commit in B.
    Commit,
}

impl FloorKind {
    pub const ALL: [FloorKind; 3] = [Self::Echo, Self::Grpc, Self::Commit];

    /// Its topology column.
    pub fn topology(self) -> &'static str {
        match self {
            Self::Echo => "floor (a) ws echo",
            Self::Grpc => "floor (b) ws+2 gRPC",
            Self::Commit => "floor (c) ws+2 gRPC+commit",
        }
    }

    /// How a row names the floor it is read against.
    pub fn mark(self) -> &'static str {
        match self {
            Self::Echo => "(a)",
            Self::Grpc => "(b)",
            Self::Commit => "(c)",
        }
    }

    fn backend(self) -> &'static str {
        match self {
            Self::Commit => "embedded",
            _ => "—",
        }
    }

    /// The scenarios measured on it: those it is the floor of, and `ack`
    /// on (b) beside (c).
    pub fn measures(self, scenario: Scenario) -> bool {
        scenario.floor() == Some(self) || (self == Self::Grpc && scenario == Scenario::Ack)
    }
}

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
    /// Starts the three floors (their WebSocket URLs in [`url`](Self::url)).
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

/// Starts B (empty and committing), A in front of each, and the three
/// WebSocket servers; on the floor runtime.
async fn start_servers(
    echo: Echo,
    path: &std::path::Path,
) -> anyhow::Result<Vec<(FloorKind, String)>> {
    let options = EmbeddedOptions::default();
    let partitions = options.partitions as usize;
    let store = Arc::new(EmbeddedStore::open(path, options).await?);
    // The partitions held as a static coordinator holds them.
    let member = uuid::Uuid::new_v4().simple().to_string();
    let grant = store
        .acquire_leases(AcquireLeases {
            member: member.clone(),
            address: String::new(),
            partitions: Vec::new(),
            ttl_ms: 3_600_000,
            steal: true,
        })
        .await?;
    let mut epochs = vec![0; partitions];
    for lease in &grant.granted {
        if let Some(epoch) = epochs.get_mut(lease.partition as usize) {
            *epoch = lease.epoch;
        }
    }
    let ownership = Arc::new(grpc::Ownership { member, epochs });

    let mut urls = Vec::new();
    for kind in FloorKind::ALL {
        let coordinator = match kind {
            FloorKind::Echo => None,
            FloorKind::Grpc | FloorKind::Commit => {
                let committing = (kind == FloorKind::Commit).then(|| store.clone());
                let (b, b_address) = listener().await?;
                tokio::spawn(grpc::serve(grpc::Recorder { store: committing }, b));
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
        let broadcast = kind == FloorKind::Echo;
        tokio::spawn(ws::serve(
            ws::Hub::new(echo, coordinator, broadcast),
            socket,
        ));
        urls.push((kind, format!("ws://{address}")));
    }
    Ok(urls)
}

/// Measures, on each floor, the scenarios of `plan` it measures, with the
/// same client and settings as the real ones. A floor that cannot start is
/// an error row per scenario it would have measured.
pub async fn measure(plan: &Plan, echo: Echo) -> Vec<Row> {
    let floors = Floors::start(echo).await;
    let mut rows = Vec::new();
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
                rows.extend(crate::scenarios::run(&on_floor, &target).await);
            }
            Err(e) => rows.extend(
                scenarios
                    .into_iter()
                    .map(|s| target.row(s, None, Outcome::Failed(format!("{e:#}")), "")),
            ),
        }
    }
    rows
}

//! What routing costs an internal caller: the same Submit + Wait calls made
//! through the [`Router`] and straight to the owning coordinator, and a Get
//! of a run the router has not seen (its session is read from the store's
//! run record first). The router's calls take and give the API's domain
//! types, so they include the conversions a direct client skips. Everything
//! runs in this process over loopback gRPC:
//! one memory store, two coordinators with balanced placement, the echo
//! runtime answering at once.
//!
//! ```sh
//! cargo run --release -p run-coordinator-api --example routing_cost -- 2000
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::coordinator::Coordinator;
use run_coordinator::ownership::{OwnershipConfig, OwnershipMode, Placement};
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::server::{ServeOptions, serve_coordinator};
use run_coordinator_api::grpc::convert::submit_from_pb;
use run_coordinator_api::model::SubmitRequest;
use run_coordinator_api::{Router, RouterConfig};
use session_store::SessionStore;
use session_store::backend::memory::MemoryStore;
use session_store_api::grpc::client::RemoteStore;
use tokio::net::TcpListener;

const PARTITIONS: u32 = 64;

async fn start_store() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let backend: Arc<dyn SessionStore> = Arc::new(MemoryStore::with_partitions(PARTITIONS));
    tokio::spawn(session_store::server::serve_store(
        backend,
        session_store::server::ServeOptions::default(),
        listener,
        std::future::pending(),
    ));
    url
}

async fn start_coordinator(store_url: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = CoordinatorConfig {
        max_executing: 64,
        ownership: OwnershipConfig {
            mode: OwnershipMode::Lease,
            placement: Placement::Balanced,
            advertise_address: url.clone(),
            lease_ttl: Duration::from_secs(2),
            renew_interval: Duration::from_millis(400),
            ..OwnershipConfig::default()
        },
        ..CoordinatorConfig::default()
    };
    let store = RemoteStore::connect(store_url).await.unwrap();
    let runtime = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 1,
        pace: Duration::ZERO,
    }));
    let coordinator = Coordinator::start(Arc::new(store), runtime, config)
        .await
        .unwrap();
    tokio::spawn(serve_coordinator(
        coordinator,
        ServeOptions::default(),
        listener,
        std::future::pending(),
    ));
    url
}

fn submit(run_id: &str, session: &str) -> pb::SubmitRequest {
    pb::SubmitRequest {
        run_id: run_id.into(),
        session_key: session.into(),
        kind: "agent".into(),
        message: "hello".into(),
        ..Default::default()
    }
}

/// The same request in the API's domain types, as the router takes it.
fn domain_submit(run_id: &str, session: &str) -> anyhow::Result<SubmitRequest> {
    Ok(submit_from_pb(submit(run_id, session))?)
}

fn wait(run_id: &str) -> pb::WaitRequest {
    pb::WaitRequest {
        run_id: run_id.into(),
        timeout_ms: 10_000,
    }
}

/// Median and mean of `samples`, in microseconds.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    format!(
        "p50 {:>6} µs, mean {:>6} µs",
        samples[samples.len() / 2].as_micros(),
        mean.as_micros()
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(500);
    let store_url = start_store().await;
    let a = start_coordinator(&store_url).await;
    let b = start_coordinator(&store_url).await;
    let store = RemoteStore::connect(&store_url).await?;
    // Spread over both before measuring.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let table = store.list_leases().await?;
        let owners: std::collections::HashSet<&str> = table
            .leases
            .iter()
            .filter(|l| l.owner.is_some() && l.expires_at_ms > table.now_ms)
            .map(|l| l.address.as_str())
            .collect();
        let held = table.leases.iter().filter(|l| l.owner.is_some()).count();
        if owners.len() == 2 && held == PARTITIONS as usize {
            break;
        }
        anyhow::ensure!(Instant::now() < until, "the partitions never spread");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let table = store.list_leases().await?;
    let router = Router::new(RouterConfig::new(&format!("{a},{b}"))?, store.clone())?;
    let mut direct = std::collections::HashMap::new();
    for address in [&a, &b] {
        direct.insert(
            address.clone(),
            RunCoordinatorClient::connect(address.clone()).await?,
        );
    }
    let owner_of = |session: &str| {
        let partition = clawgate_common::partition::partition_of(session, PARTITIONS);
        table.leases[partition as usize].address.clone()
    };
    // Warm both paths up (connections, the router's lease table).
    for i in 0..50 {
        let session = format!("agent:main:warm{i}");
        router
            .submit(domain_submit(&format!("warm-r{i}"), &session)?)
            .await?;
        let mut client = direct[&owner_of(&session)].clone();
        client
            .submit(submit(&format!("warm-d{i}"), &session))
            .await?;
    }
    let (mut routed, mut straight, mut cold) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..calls {
        let session = format!("agent:main:s{}", i % 97);
        let id = format!("routed-{i}");
        let started = Instant::now();
        router.submit(domain_submit(&id, &session)?).await?;
        router.wait(&id, 10_000).await?;
        routed.push(started.elapsed());

        let id = format!("direct-{i}");
        let mut client = direct[&owner_of(&session)].clone();
        let started = Instant::now();
        client.submit(submit(&id, &session)).await?;
        client.wait(wait(&id)).await?;
        straight.push(started.elapsed());

        // A run the router never saw: its session comes from the record.
        let started = Instant::now();
        router.get(&format!("direct-{i}")).await?;
        cold.push(started.elapsed());
    }
    println!("{calls} calls each, two balanced coordinators, in process over loopback:");
    println!("  Submit + Wait through the router:  {}", summary(routed));
    println!("  Submit + Wait to the owner:        {}", summary(straight));
    println!("  Get of a run the router never saw: {}", summary(cold));
    Ok(())
}

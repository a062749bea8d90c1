//! `half-open`: the gateway's resident memory per socket that sent half a
//! request head and nothing more (what a client holding sockets without a
//! token costs; see the crate's documentation). The gateway must let them
//! stay for the measurement: the bench's own gateway has its head timeout
//! raised (`EDGE_HEADER_READ_TIMEOUT`), and its per-address cap raised to
//! what the bench opens.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use super::idle::{check_open_files, memory_row, sources};
use super::{Target, within_deadline};
use crate::client::resolve;
use crate::http;
use crate::plan::{CONNECT_CONCURRENCY, Plan, Scenario};
use crate::procs::vm_rss_kib;
use crate::progress::Progress;
use crate::table::{Memory, Row};

const HALF_A_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n";
/// How long the gateway may take to accept what was opened.
const SETTLE: Duration = Duration::from_secs(30);

pub async fn measure(plan: &Plan, target: &Target) -> Row {
    let progress = Progress::default();
    let held = within_deadline(plan, &progress, hold(plan, &progress)).await;
    memory_row(plan, target, Scenario::HalfOpen, held)
}

async fn open(
    address: std::net::SocketAddr,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(source) = source {
        socket.bind(std::net::SocketAddr::new(source, 0))?;
    }
    let mut stream = socket.connect(address).await?;
    stream.write_all(HALF_A_HEAD).await?;
    Ok(stream)
}

async fn hold(plan: &Plan, progress: &Progress) -> anyhow::Result<(Memory, String)> {
    let pid = plan
        .edge_pid
        .ok_or_else(|| anyhow::anyhow!("no gateway process to read VmRSS of (give --edge-pid)"))?;
    let wanted = plan.idle;
    check_open_files(wanted, pid)?;
    let address = resolve(&plan.url, None).await?;
    let sources = sources(&plan.url).await;
    let sockets_before = http::gauge(&plan.url, "clawgate_edge_sockets_open").await;
    let before_kib = vm_rss_kib(pid)?;
    progress.stage("half-open sockets opened", wanted);
    let started = Instant::now();
    let mut opening = futures::stream::iter(0..wanted)
        .map(|index| open(address, sources[index % sources.len()]))
        .buffer_unordered(CONNECT_CONCURRENCY);
    let mut sockets = Vec::with_capacity(wanted);
    while let Some(opened) = opening.next().await {
        sockets.push(opened.map_err(|e| {
            anyhow::anyhow!(
                "opened {} of {wanted} half-open sockets, then: {e}",
                sockets.len()
            )
        })?);
        progress.advance();
    }
    drop(opening);
    let opening_took = started.elapsed();
    // Each accepted (where the gateway says how many it holds).
    let deadline = Instant::now() + SETTLE;
    if let Some(before) = sockets_before {
        while http::gauge(&plan.url, "clawgate_edge_sockets_open")
            .await
            .is_some_and(|open| open < before + wanted as u64)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let held = http::gauge(&plan.url, "clawgate_edge_sockets_open").await;
    let after_kib = vm_rss_kib(pid)?;
    let memory = Memory {
        opened: sockets.len(),
        before_kib,
        after_kib,
    };
    let note = format!(
        "gateway VmRSS {:.1} → {:.1} MiB: {:.2} KiB per half-open socket; opened in {:.1} s; \
         the gateway's open sockets: {}",
        before_kib as f64 / 1024.0,
        after_kib as f64 / 1024.0,
        memory.per_connection_kib(),
        opening_took.as_secs_f64(),
        held.map_or("unknown".to_owned(), |n| n.to_string()),
    );
    drop(sockets);
    // Later scenarios start once the gateway has let these go.
    if let Some(before) = sockets_before {
        let deadline = Instant::now() + SETTLE;
        while http::gauge(&plan.url, "clawgate_edge_sockets_open")
            .await
            .is_some_and(|open| open > before)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok((memory, note))
}

//! The little HTTP the bench speaks: `GET /readyz` and `GET /metrics` on
//! the edge's WebSocket port.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one exchange may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// `GET path` over HTTP/1.1 (`Connection: close`); the status and the
/// body as sent (a chunked one with its chunk sizes).
pub async fn get(address: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .context("no HTTP answer in time")??;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status line")?;
    Ok((status, body.to_owned()))
}

/// The edge's `clawgate_edge_connections_open` gauge, if the gateway at
/// `url` serves `/metrics` on its port (the bench's own edges do).
pub async fn connections_open(url: &str) -> Option<u64> {
    gauge(url, "clawgate_edge_connections_open").await
}

/// The unlabelled gauge `name` of the gateway at `url`, if it serves
/// `/metrics` on its port.
pub async fn gauge(url: &str, name: &str) -> Option<u64> {
    let address = crate::client::resolve(url, None).await.ok()?;
    let (status, body) = get(address, "/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    let prefix = format!("{name} ");
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
}

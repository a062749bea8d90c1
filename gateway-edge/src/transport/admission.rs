//! Sockets from accept to upgrade: what a socket may hold before it has
//! sent a request, and for how long.
//!
//! Every accepted socket takes a [`SocketSlot`] at once, before anything is
//! read from it: a permit of the edge's cap on open sockets
//! (`EDGE_MAX_SOCKETS`, an owned semaphore permit) and a slot of its
//! address (`EDGE_SOCKETS_PER_IP`, an IPv6 address by its /64; a trusted
//! proxy's own address is not limited). The slot lives as long as the
//! socket does, through the upgrade and the WebSocket's life. A socket
//! over either cap is answered `503` and closed on the spot, so that a
//! client holding many half-open sockets can neither run the process out
//! of file descriptors nor keep other addresses out.
//!
//! The time before the upgrade is bounded twice: hyper closes a socket
//! that has not sent a whole request head within `EDGE_HEADER_READ_TIMEOUT`
//! (the server's timer), and a plain HTTP connection on which no byte
//! moves either way for `EDGE_HTTP_IDLE_TIMEOUT` is closed
//! ([`Watched`], [`idle`]).

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::EdgeConfig;
use crate::config::cidr::Cidr;
use crate::state::limits::{AddressBudget, AddressSlot, Refusal};
use crate::state::metrics::EdgeMetrics;

/// The caps every accepted socket is counted against.
pub struct SocketCaps {
    total: Arc<Semaphore>,
    cap: usize,
    per_address: AddressBudget,
    trusted: Vec<Cidr>,
    metrics: Arc<EdgeMetrics>,
}

impl SocketCaps {
    pub fn new(config: &EdgeConfig, metrics: Arc<EdgeMetrics>) -> Self {
        let cap = config.socket_cap().min(Semaphore::MAX_PERMITS);
        Self {
            total: Arc::new(Semaphore::new(cap)),
            cap,
            per_address: AddressBudget::new(config.sockets_per_ip, usize::MAX),
            trusted: config.trusted_proxies.clone(),
            metrics,
        }
    }

    /// The cap on open sockets in force.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A slot for a socket from `peer`, or why there is none.
    pub fn admit(&self, peer: IpAddr) -> Result<SocketSlot, Refusal> {
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Total)?;
        let address = if self.trusted.iter().any(|c| c.contains(peer)) {
            None
        } else {
            Some(self.per_address.take(peer)?)
        };
        self.metrics.socket_opened();
        Ok(SocketSlot {
            _permit: permit,
            _address: address,
            metrics: self.metrics.clone(),
        })
    }
}

/// An open socket's place in the caps, given back when it drops (the
/// socket is gone).
pub struct SocketSlot {
    _permit: OwnedSemaphorePermit,
    _address: Option<AddressSlot>,
    metrics: Arc<EdgeMetrics>,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.metrics.socket_closed();
    }
}

/// Answers a socket over a cap `503` without reading from it, and closes
/// it. The answer fits an empty send buffer, so the write never waits; a
/// client that has not sent its request yet reads it whole.
pub fn refuse(stream: TcpStream, refusal: Refusal) {
    let body: &str = match refusal {
        Refusal::PerAddress => "Too many sockets from this address\n",
        Refusal::Total => "Too many sockets\n",
    };
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: text/plain\r\n\
         retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

/// When bytes last moved on a socket, shared between its IO and its watch.
#[derive(Clone)]
pub struct Activity {
    since: Instant,
    /// Milliseconds from `since` to the last read or write that moved bytes.
    last_ms: Arc<AtomicU64>,
}

impl Default for Activity {
    /// Bytes moved just now.
    fn default() -> Self {
        Self {
            since: Instant::now(),
            last_ms: Arc::default(),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Resolves once no byte moved on the socket of `activity` for `timeout`.
pub async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        let deadline = activity.last() + timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// An IO that notes in its [`Activity`] when bytes move.
pub struct Watched<T> {
    inner: T,
    activity: Activity,
}

impl<T> Watched<T> {
    pub fn new(inner: T, activity: Activity) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

//! A TCP proxy on loopback port 0 for fault injection: it forwards each
//! connection to its current upstream (which a test moves when it restarts
//! the process behind it, so that the others keep one address), and it can
//! cut every open connection at once, refuse connections for a while (a
//! network partition that both sides notice), or go silent (a blackhole:
//! nothing is refused or reset, no byte moves either way, new connections
//! are taken and never answered, until it heals and what was held goes on,
//! as TCP's retransmissions would deliver it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct State {
    upstream: SocketAddr,
    /// Cancelled to cut every connection opened before; then replaced.
    generation: CancellationToken,
    /// Until then, connections are refused and open ones cut.
    blocked_until: Option<Instant>,
}

pub struct FaultProxy {
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Whether the link is silent now (a blackhole).
    silent: watch::Sender<bool>,
    stop: CancellationToken,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            upstream,
            generation: CancellationToken::new(),
            blocked_until: None,
        }));
        let stop = CancellationToken::new();
        let silent = watch::Sender::new(false);
        tokio::spawn(accept(
            listener,
            state.clone(),
            silent.subscribe(),
            stop.clone(),
        ));
        Self {
            address,
            state,
            silent,
            stop,
        }
    }

    /// `http://address`, as the services are given it.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// New connections go to `upstream`; open ones are cut.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        let mut state = self.state.lock().unwrap();
        state.upstream = upstream;
        state.generation.cancel();
        state.generation = CancellationToken::new();
    }

    /// Cuts every open connection (both sides see a reset or an EOF).
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.generation.cancel();
        state.generation = CancellationToken::new();
    }

    /// Whether connections are refused now.
    pub fn is_partitioned(&self) -> bool {
        let state = self.state.lock().unwrap();
        state
            .blocked_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// Cuts every open connection and refuses new ones for `how_long`.
    pub fn partition(&self, how_long: Duration) {
        self.cut();
        self.state.lock().unwrap().blocked_until = Some(Instant::now() + how_long);
    }

    /// Goes silent until [`heal`](Self::heal): open connections stay open
    /// and carry nothing, new ones are taken and left unanswered.
    pub fn silence(&self) {
        self.silent.send_replace(true);
    }

    /// Ends a silence: what was held moves on.
    pub fn heal(&self) {
        self.silent.send_replace(false);
    }

    /// Whether the link is silent now.
    pub fn is_silent(&self) -> bool {
        *self.silent.borrow()
    }

    /// Silent for `how_long`, then healed (by a task of the test's runtime).
    pub fn blackhole(&self, how_long: Duration) {
        self.silence();
        let silent = self.silent.clone();
        tokio::spawn(async move {
            tokio::time::sleep(how_long).await;
            silent.send_replace(false);
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.lock().unwrap().generation.cancel();
    }
}

async fn accept(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    silent: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    loop {
        let (inbound, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let (upstream, generation) = {
            let state = state.lock().unwrap();
            if state
                .blocked_until
                .is_some_and(|until| Instant::now() < until)
            {
                // Dropped: the caller sees its connection closed at once.
                continue;
            }
            (state.upstream, state.generation.clone())
        };
        let silent = silent.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = forward(inbound, upstream, silent) => {}
                () = generation.cancelled() => {}
            }
        });
    }
}

/// Forwards one connection both ways, holding every byte while the link
/// is silent.
async fn forward(inbound: TcpStream, upstream: SocketAddr, mut silent: watch::Receiver<bool>) {
    // A connection taken during a silence is not answered until it heals.
    if silent.wait_for(|silent| !silent).await.is_err() {
        return;
    }
    let Ok(outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::select! {
        () = pump(in_read, out_write, silent.clone()) => {}
        () = pump(out_read, in_write, silent) => {}
    }
}

/// Copies `from` to `to` until either ends, moving nothing while silent:
/// a read waits for the link to speak, and so does the write of what was
/// read.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut silent: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if silent.wait_for(|silent| !silent).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if silent.wait_for(|silent| !silent).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes what it reads.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    async fn read_byte(socket: &mut TcpStream, within: Duration) -> Option<u8> {
        let mut byte = [0u8];
        match tokio::time::timeout(within, socket.read_exact(&mut byte)).await {
            Ok(Ok(_)) => Some(byte[0]),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_silent_link_holds_bytes_and_new_connections_until_it_heals() {
        let proxy = FaultProxy::start(echo().await).await;
        let mut open = TcpStream::connect(proxy.address).await.unwrap();
        open.write_all(b"a").await.unwrap();
        assert_eq!(
            read_byte(&mut open, Duration::from_secs(30)).await,
            Some(b'a')
        );

        proxy.silence();
        assert!(proxy.is_silent());
        open.write_all(b"b").await.unwrap();
        // Taken, not refused: a blackhole answers nothing.
        let mut new = TcpStream::connect(proxy.address).await.unwrap();
        new.write_all(b"c").await.unwrap();
        let quiet = Duration::from_millis(200);
        assert_eq!(
            read_byte(&mut open, quiet).await,
            None,
            "a byte crossed the silence"
        );
        assert_eq!(
            read_byte(&mut new, quiet).await,
            None,
            "a byte crossed the silence"
        );

        proxy.heal();
        assert_eq!(
            read_byte(&mut open, Duration::from_secs(30)).await,
            Some(b'b')
        );
        assert_eq!(
            read_byte(&mut new, Duration::from_secs(30)).await,
            Some(b'c')
        );
    }
}

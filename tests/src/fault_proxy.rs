//! A TCP proxy on loopback port 0 for fault injection: it forwards each
//! connection to its current upstream (which a test moves when it restarts
//! the process behind it, so that the others keep one address), and it can
//! cut every open connection at once or refuse connections for a while (a
//! network partition).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
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
        tokio::spawn(accept(listener, state.clone(), stop.clone()));
        Self {
            address,
            state,
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
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.lock().unwrap().generation.cancel();
    }
}

async fn accept(listener: TcpListener, state: Arc<Mutex<State>>, stop: CancellationToken) {
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
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let mut inbound = inbound;
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                () = generation.cancelled() => {}
            }
        });
    }
}

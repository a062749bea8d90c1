//! A TCP balancer on loopback port 0: what a Kubernetes Service is to the
//! replicas behind it. Each connection goes to the next backend that accepts
//! it (round robin, skipping refused ones); bytes are copied both ways until
//! either side closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Balancer {
    pub address: SocketAddr,
    stop: CancellationToken,
}

impl Balancer {
    pub async fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let next = Arc::new(AtomicUsize::new(0));
        let backends = Arc::new(backends);
        let until = stop.clone();
        tokio::spawn(async move {
            loop {
                let (inbound, _) = tokio::select! {
                    () = until.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                };
                let (backends, next) = (backends.clone(), next.clone());
                tokio::spawn(async move {
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    for i in 0..backends.len() {
                        let backend = backends[(start + i) % backends.len()];
                        if let Ok(mut outbound) = TcpStream::connect(backend).await {
                            let _ = outbound.set_nodelay(true);
                            let mut inbound = inbound;
                            let _ = inbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Self { address, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

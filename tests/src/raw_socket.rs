//! TCP sockets that do not speak the protocol: what a careless or hostile
//! client holds open (nothing sent, half a request head, a request whose
//! body never comes), from any local address.

use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::client::DEADLINE;

/// A TCP connection to `address` from `source` (a loopback alias such as
/// 127.0.0.2 on loopback), nothing sent.
pub async fn connect_from(address: SocketAddr, source: IpAddr) -> std::io::Result<TcpStream> {
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(address).await
}

/// A connection from `source` that sent `sent` and nothing more.
pub async fn sending(address: SocketAddr, source: IpAddr, sent: &str) -> TcpStream {
    let mut stream = connect_from(address, source)
        .await
        .unwrap_or_else(|e| panic!("connect to {address} from {source}: {e}"));
    stream
        .write_all(sent.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write to {address}: {e}"));
    stream
}

/// Reads until the peer closes the socket (an end of file or a reset) and
/// returns what came; panics when it is still open after [`DEADLINE`].
pub async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(
        read.is_ok(),
        "the socket is still open after {DEADLINE:?}; it sent {got:?}"
    );
    got
}

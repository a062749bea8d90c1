//! The TLS server's handshake limits: a peer that connects and never
//! finishes its handshake is dropped at `--tls-handshake-timeout`, and past
//! `--tls-max-handshakes` a new connection waits for a free slot instead
//! of being handshaken.

use std::time::Duration;

use clawgate_telemetry::tls::testing::{Ca, hex};
use clawgate_telemetry::tls::{ClientTls, ServerTls, incoming, serial_hex};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// Long enough for any handshake on a loaded machine; the bound on the
/// waits below, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(60);

struct Server {
    address: std::net::SocketAddr,
    client: ClientTls,
    _files: tempfile::TempDir,
}

/// A TLS server (no client certificates asked) whose handshaken
/// connections are taken and dropped.
async fn server(timeout: Duration, max_handshakes: usize) -> Server {
    let files = tempfile::tempdir().unwrap();
    let ca = Ca::new("limits CA");
    let ca_file = ca.write(files.path());
    let (cert, key) = ca.leaf("server", 42).write(files.path());
    let tls = ServerTls::new(cert, key, None, timeout, max_handshakes).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut connections = incoming(listener, Some(&tls));
    tokio::spawn(async move { while connections.next().await.is_some() {} });
    Server {
        address,
        client: ClientTls::new(Some(ca_file), None).unwrap(),
        _files: files,
    }
}

/// Connects and sends nothing; returns when the server closed it.
async fn stall(address: std::net::SocketAddr) {
    let mut socket = TcpStream::connect(address).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PATIENCE, socket.read(&mut byte))
        .await
        .expect("the server closes a stalled handshake");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, nothing sent: {read:?}"
    );
}

#[tokio::test]
async fn a_stalled_handshake_is_dropped_at_the_timeout() {
    let server = server(Duration::from_millis(200), 8).await;
    stall(server.address).await;
    // The server still serves handshakes.
    let served = server.client.handshake(server.address).await.unwrap();
    assert_eq!(serial_hex(&served), Some(hex(42)));
}

#[tokio::test]
async fn past_the_bound_a_handshake_waits_for_a_free_slot() {
    let server = server(Duration::from_millis(300), 1).await;
    // The one slot is taken by a peer that never speaks…
    let mut stalled = TcpStream::connect(server.address).await.unwrap();
    // …so a good client is handshaken only after the server dropped that
    // peer: the server closes it before it accepts the next, and loopback
    // delivers in the order sent, so when the handshake can be done the
    // close can be read (checked first).
    let mut handshake = std::pin::pin!(server.client.handshake(server.address));
    let mut byte = [0u8; 1];
    tokio::select! {
        biased;
        read = stalled.read(&mut byte) => {
            assert!(matches!(read, Ok(0) | Err(_)), "closed, nothing sent: {read:?}");
        }
        done = &mut handshake => panic!("handshaken while the one slot was taken: {done:?}"),
        () = tokio::time::sleep(PATIENCE) => panic!("the stalled handshake was never dropped"),
    }
    let served = tokio::time::timeout(PATIENCE, handshake)
        .await
        .expect("the handshake is done once the slot is free")
        .unwrap();
    assert_eq!(serial_hex(&served), Some(hex(42)));
}

/// A gRPC health check over a new connection to `address`, as `client`.
async fn health_check(client: &ClientTls, address: std::net::SocketAddr) -> bool {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{address}")).unwrap();
    let mut health = HealthClient::new(client.lazy_channel(&endpoint));
    health.check(HealthCheckRequest::default()).await.is_ok()
}

#[tokio::test]
async fn a_client_ca_replaced_on_disk_decides_the_next_handshakes() {
    let files = tempfile::tempdir().unwrap();
    let (ours, theirs) = (Ca::new("our CA"), Ca::new("their CA"));
    let server_dir = files.path().join("server");
    let client_dir = files.path().join("client");
    for dir in [&server_dir, &client_dir] {
        std::fs::create_dir(dir).unwrap();
    }
    let (cert, key) = ours.leaf("server", 1).write(&server_dir);
    let client_ca = ours.write(&server_dir);
    let tls = ServerTls::new(cert, key, Some(client_ca.clone()), PATIENCE, 8).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (_, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(incoming(listener, Some(&tls))),
    );
    // A client with a certificate of their CA, trusting ours for the server.
    let identity = theirs.leaf("client", 2).write(&client_dir);
    let server_ca = files.path().join("server-ca.pem");
    std::fs::write(&server_ca, ours.cert_pem()).unwrap();
    let client = ClientTls::new(Some(server_ca), Some(identity)).unwrap();
    assert!(
        !health_check(&client, address).await,
        "their CA is not trusted yet"
    );

    // The client CA file now names their CA: the next connections pass.
    std::fs::write(&client_ca, theirs.cert_pem()).unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !health_check(&client, address).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new client CA was never used"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

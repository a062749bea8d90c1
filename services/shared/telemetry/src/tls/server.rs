//! The server side: the certificate served and the client certificates
//! required (both re-read when their files change), and the incoming
//! connections tonic serves — TLS handshakes done off the accept loop,
//! each within a timeout, a bounded number at once.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use super::reload::{CHECK_INTERVAL, Reloading, certified_key, verifier};
use super::{ALPN_H2, provider};
use crate::accept::AcceptBackoff;

/// A server's TLS: its configuration and the handshake limits.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    max_handshakes: usize,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_handshakes", &self.max_handshakes)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files now (an error names the one that does not load).
    pub fn new(
        cert: PathBuf,
        key: PathBuf,
        client_ca: Option<PathBuf>,
        handshake_timeout: Duration,
        max_handshakes: usize,
    ) -> Result<Self, String> {
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?;
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(Arc::new(ReloadingClientVerifier::new(
                ca,
                provider.clone(),
            )?)),
            None => builder.with_no_client_auth(),
        };
        let certificate = Reloading::new(
            "the TLS certificate (--tls-cert, --tls-key)",
            vec![cert, key],
            Box::new(certified_key(provider)),
            CHECK_INTERVAL,
        )?;
        let mut config = builder.with_cert_resolver(Arc::new(ReloadingCertificate(certificate)));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshake_timeout,
            max_handshakes: max_handshakes.max(1),
        })
    }
}

/// The certificate served: the files' current one.
struct ReloadingCertificate(Reloading<Arc<CertifiedKey>>);

impl std::fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadingCertificate")
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// Client certificates must lead to a CA of the file, as it is now.
struct ReloadingClientVerifier {
    verifier: Reloading<Arc<dyn ClientCertVerifier>>,
    /// The schemes, fixed by the provider whatever the CAs.
    schemes: Vec<SignatureScheme>,
}

impl ReloadingClientVerifier {
    fn new(ca: PathBuf, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let (verifier, schemes) = verifier(
            "the client CA (--tls-client-ca)",
            ca,
            provider,
            |roots, provider| {
                WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| e.to_string())
            },
        )?;
        Ok(Self { verifier, schemes })
    }
}

impl std::fmt::Debug for ReloadingClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadingClientVerifier")
    }
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the CAs may change under a borrow, and the services'
    /// clients present their one certificate whatever the hints.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier
            .current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier
            .current()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier
            .current()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}

/// The connections a gRPC server serves: plaintext, or TLS handshaken.
pub struct Incoming(Kind);

enum Kind {
    Plain(TcpIncoming),
    Tls {
        handshaken: mpsc::Receiver<Conn>,
        /// The accept loop; stopped when the server drops its incoming.
        accepting: JoinHandle<()>,
    },
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if let Kind::Tls { accepting, .. } = &self.0 {
            accepting.abort();
        }
    }
}

/// What `listener` serves: TLS when `tls` is given, plaintext otherwise;
/// `TCP_NODELAY` on every connection.
pub fn incoming(listener: TcpListener, tls: Option<&ServerTls>) -> Incoming {
    match tls {
        None => Incoming(Kind::Plain(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
        )),
        Some(tls) => {
            // Few: a handshaken connection waits here only while tonic
            // starts serving the one before it.
            let (sender, handshaken) = mpsc::channel(16);
            let accepting = tokio::spawn(accept_loop(listener, tls.clone(), sender));
            Incoming(Kind::Tls {
                handshaken,
                accepting,
            })
        }
    }
}

impl futures::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match &mut self.0 {
            Kind::Plain(tcp) => Pin::new(tcp)
                .poll_next(cx)
                .map(|next| next.map(|accepted| accepted.map(Conn::Plain))),
            Kind::Tls { handshaken, .. } => handshaken.poll_recv(cx).map(|next| next.map(Ok)),
        }
    }
}

/// Accepts connections and hands each to its own handshake: a peer that
/// stalls its handshake holds one of `max_handshakes` permits for at most
/// the timeout, and never the accept loop.
async fn accept_loop(listener: TcpListener, tls: ServerTls, handshaken: mpsc::Sender<Conn>) {
    let permits = Arc::new(Semaphore::new(tls.max_handshakes));
    let mut backoff = AcceptBackoff::default();
    loop {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff.accepted();
                accepted
            }
            Err(error) => {
                tokio::time::sleep(backoff.failed("gRPC TLS", &error)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, handshaken) = (tls.acceptor.clone(), handshaken.clone());
        let timeout = tls.handshake_timeout;
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(timeout, acceptor.accept(tcp)).await;
            drop(permit);
            match outcome {
                Ok(Ok(stream)) => {
                    let _ = handshaken.send(Conn::Tls(Box::new(stream))).await;
                }
                Ok(Err(error)) => crate::limited!(
                    warn,
                    %peer,
                    %error,
                    "gRPC TLS handshake failed; connection dropped"
                ),
                Err(_) => crate::limited!(
                    warn,
                    %peer,
                    timeout_ms = timeout.as_millis() as u64,
                    "gRPC TLS handshake not done in time (--tls-handshake-timeout); connection dropped"
                ),
            }
        });
    }
}

/// One served connection.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Self::Plain(tcp) => tcp.connect_info(),
            Self::Tls(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

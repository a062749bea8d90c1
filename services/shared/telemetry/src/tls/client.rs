//! The client side: channels to `https://` addresses over TLS, verifying
//! the server against the CAs of `--tls-ca` and presenting this process's
//! certificate (both re-read when their files change); `http://` addresses
//! stay plaintext.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use super::reload::{CHECK_INTERVAL, Reloading, certified_key, verifier};
use super::{ALPN_H2, provider};

/// How this process's clients speak TLS.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// Servers verified with the CAs of `ca` (unset: the Mozilla roots);
    /// `identity` (certificate, key), when given, presented to servers
    /// that ask. The files are loaded now.
    pub fn new(ca: Option<PathBuf>, identity: Option<(PathBuf, PathBuf)>) -> Result<Self, String> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?;
        let builder = match ca {
            Some(ca) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ReloadingServerVerifier::new(
                    ca,
                    provider.clone(),
                )?)),
            None => builder.with_root_certificates(RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            }),
        };
        let mut config = match identity {
            Some((cert, key)) => {
                let certificate = Reloading::new(
                    "the TLS certificate (--tls-cert, --tls-key)",
                    vec![cert, key],
                    Box::new(certified_key(provider)),
                    CHECK_INTERVAL,
                )?;
                builder.with_client_cert_resolver(Arc::new(ReloadingIdentity(certificate)))
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The TLS of a process given no TLS settings: `https://` servers
    /// verified with the Mozilla roots, no client certificate.
    pub fn system() -> &'static Self {
        static SYSTEM: OnceLock<ClientTls> = OnceLock::new();
        SYSTEM.get_or_init(|| Self::new(None, None).expect("the compiled-in roots load"))
    }

    /// A channel to `endpoint`, connected at its first call: over TLS when
    /// its address is `https://`.
    pub fn lazy_channel(&self, endpoint: &Endpoint) -> Channel {
        match is_tls(endpoint.uri()) {
            true => endpoint.connect_with_connector_lazy(self.connector()),
            false => endpoint.connect_lazy(),
        }
    }

    /// A channel to `endpoint`, connected now.
    pub async fn channel(&self, endpoint: &Endpoint) -> Result<Channel, tonic::transport::Error> {
        match is_tls(endpoint.uri()) {
            true => endpoint.connect_with_connector(self.connector()).await,
            false => endpoint.connect().await,
        }
    }

    /// Does a TLS handshake with the server at `address` (no gRPC after):
    /// the certificate it served, or why the handshake failed.
    pub async fn handshake(
        &self,
        address: std::net::SocketAddr,
    ) -> io::Result<CertificateDer<'static>> {
        let tcp = TcpStream::connect(address).await?;
        let name = ServerName::IpAddress(address.ip().into());
        let tls = tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await?;
        let served = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
        served
            .cloned()
            .ok_or_else(|| io::Error::other("the server sent no certificate"))
    }

    fn connector(&self) -> TlsConnector {
        TlsConnector(tokio_rustls::TlsConnector::from(self.config.clone()))
    }
}

/// [`ClientTls::lazy_channel`] with `tls`, or with [`ClientTls::system`].
pub fn lazy_channel(endpoint: &Endpoint, tls: Option<&ClientTls>) -> Channel {
    tls.unwrap_or_else(|| ClientTls::system())
        .lazy_channel(endpoint)
}

/// Whether `uri` asks for TLS.
pub fn is_tls(uri: &Uri) -> bool {
    uri.scheme_str() == Some("https")
}

/// Opens TCP connections and does the TLS handshake, the server named by
/// the address's host.
#[derive(Clone)]
struct TlsConnector(tokio_rustls::TlsConnector);

type Connecting = Pin<
    Box<
        dyn Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send,
    >,
>;

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.0.clone();
        Box::pin(async move {
            let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("{uri}: no host")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| invalid(format!("{uri}: {e}")))?;
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            Ok(TokioIo::new(connector.connect(name, tcp).await?))
        })
    }
}

/// The certificate presented to servers that ask: the files' current one.
struct ReloadingIdentity(Reloading<Arc<CertifiedKey>>);

impl std::fmt::Debug for ReloadingIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadingIdentity")
    }
}

impl ResolvesClientCert for ReloadingIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Servers must lead to a CA of the file, as it is now, and be issued for
/// the host connected to.
struct ReloadingServerVerifier {
    verifier: Reloading<Arc<WebPkiServerVerifier>>,
    schemes: Vec<SignatureScheme>,
}

impl ReloadingServerVerifier {
    fn new(ca: PathBuf, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let (verifier, schemes) = verifier(
            "the server CA (--tls-ca)",
            ca,
            provider,
            |roots, provider| {
                WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| e.to_string())
            },
        )?;
        Ok(Self { verifier, schemes })
    }
}

impl std::fmt::Debug for ReloadingServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadingServerVerifier")
    }
}

impl ServerCertVerifier for ReloadingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
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

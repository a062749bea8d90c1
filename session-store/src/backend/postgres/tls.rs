//! PostgreSQL over TLS, on rustls: `sslmode` and `sslrootcert` in the
//! store's URL mean what libpq says they mean.
//!
//! | `sslmode` | encrypted | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow`, `prefer` (the default) | when the server offers TLS | not checked |
//! | `require` | always | not checked, unless `sslrootcert` is given: then as `verify-ca` |
//! | `verify-ca` | always | signed by a root of `sslrootcert` |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the
//! Mozilla roots compiled in (`webpki-roots`); `verify-ca` and
//! `verify-full` without it use those roots too (libpq would read
//! `~/.postgresql/root.crt`, which a container does not have). `allow`
//! tries TLS first, as `prefer` does (libpq tries plaintext first).
//!
//! tokio-postgres itself parses neither the verifying modes nor
//! `sslrootcert`, so both are taken out of the URL here, and what is left
//! goes to its parser.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use session_store_api::{StoreError, StoreResult};
use tokio_postgres::config::SslMode as WireMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The URL's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> StoreResult<Self> {
        Ok(match value {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(StoreError::invalid(format!(
                    "invalid PostgreSQL URL: sslmode={other:?} is none of disable, allow, \
                     prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }
}

/// Where the roots that vouch for the server come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// The Mozilla roots compiled in.
    System,
    File(PathBuf),
}

/// How the store connects to PostgreSQL: the connection settings
/// tokio-postgres parsed, and the TLS to use.
pub struct Connector {
    pub config: tokio_postgres::Config,
    /// `None`: plaintext (`sslmode=disable`).
    pub tls: Option<MakeRustlsConnect>,
    pub mode: SslMode,
}

impl Connector {
    /// Reads `url` (a `postgres://` URL or `key=value` words) and prepares
    /// its TLS: a CA file that cannot be read fails here, at start, not at
    /// the first connection.
    pub fn from_url(url: &str) -> StoreResult<Self> {
        let (rest, mode, root_cert) = take_tls_parameters(url)?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
            StoreError::invalid(format!(
                "invalid PostgreSQL URL: {}",
                super::rows::describe(&e)
            ))
        })?;
        let mode = mode.unwrap_or(SslMode::Prefer);
        let roots = match root_cert.as_deref() {
            None => None,
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(PathBuf::from(path))),
        };
        let verify = match (mode, roots) {
            (SslMode::Disable, _) => None,
            (SslMode::Allow | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Some(Verify::Nothing)
            }
            (SslMode::Require | SslMode::VerifyCa, roots) => {
                Some(Verify::Chain(roots.unwrap_or(Roots::System)))
            }
            (SslMode::VerifyFull, roots) => Some(Verify::Full(roots.unwrap_or(Roots::System))),
        };
        config.ssl_mode(match mode {
            SslMode::Disable => WireMode::Disable,
            SslMode::Allow | SslMode::Prefer => WireMode::Prefer,
            _ => WireMode::Require,
        });
        let tls = verify
            .map(|verify| client_config(&verify).map(MakeRustlsConnect::new))
            .transpose()?;
        Ok(Self { config, tls, mode })
    }
}

/// Splits `sslmode` and `sslrootcert` off `url`; the rest, for
/// tokio-postgres.
fn take_tls_parameters(url: &str) -> StoreResult<(String, Option<SslMode>, Option<String>)> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |key: &str, value: String| -> StoreResult<bool> {
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => root_cert = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), None, None));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !take(key, percent_decoded(value)?)? {
                kept.push(pair);
            }
        }
        let rest = match kept.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", kept.join("&")),
        };
        return Ok((rest, mode, root_cert));
    }
    // `key=value` words (values with spaces quoted are left whole to
    // tokio-postgres; the two keys here take plain values).
    let mut kept = Vec::new();
    for word in url.split_whitespace() {
        let taken = match word.split_once('=') {
            Some((key, value)) => take(key.trim(), value.trim_matches('\'').to_owned())?,
            None => false,
        };
        if !taken {
            kept.push(word);
        }
    }
    Ok((kept.join(" "), mode, root_cert))
}

fn percent_decoded(value: &str) -> StoreResult<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = value
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        StoreError::invalid(format!(
                            "invalid PostgreSQL URL: bad percent-encoding in {value:?}"
                        ))
                    })?;
                out.push(hex);
                i += 3;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| StoreError::invalid("invalid PostgreSQL URL: a parameter is not UTF-8"))
}

/// What is checked of the server's certificate.
enum Verify {
    /// Encryption only (`prefer`, `require` without roots).
    Nothing,
    /// The chain, not the name (`verify-ca`, `require` with roots).
    Chain(Roots),
    /// The chain and the name (`verify-full`).
    Full(Roots),
}

/// ring, which the workspace already builds (reqwest's TLS); rustls 0.23.48
/// deprecates it for lacking post-quantum key exchange, whose provider
/// (aws-lc-rs) would add a large C build to every CI run.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(verify: &Verify) -> StoreResult<ClientConfig> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::internal(format!("TLS settings: {e}")))?;
    let (chain, check_name) = match verify {
        Verify::Nothing => (None, false),
        Verify::Chain(roots) => (Some(webpki(roots, &provider)?), false),
        Verify::Full(roots) => (Some(webpki(roots, &provider)?), true),
    };
    let verifier = Verifier {
        chain,
        check_name,
        algorithms: provider.signature_verification_algorithms,
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

fn webpki(roots: &Roots, provider: &Arc<CryptoProvider>) -> StoreResult<Arc<WebPkiServerVerifier>> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::System => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::File(path) => {
            let unreadable = |e: &dyn std::fmt::Display| {
                StoreError::invalid(format!(
                    "sslrootcert {}: cannot read CA certificates: {e}",
                    path.display()
                ))
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| unreadable(&e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable(&e))?;
            if certs.is_empty() {
                return Err(unreadable(&"no certificate in the file"));
            }
            for cert in certs {
                store.add(cert).map_err(|e| unreadable(&e))?;
            }
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .build()
        .map_err(|e| StoreError::internal(format!("TLS settings: {e}")))
}

/// The check of the server's certificate each mode asks for. Whatever the
/// mode, the handshake's signatures are verified against the certificate
/// presented, so the session is encrypted to whoever holds its key; what
/// differs is whether that certificate must lead to a trusted root
/// (`chain`) and name the host (`check_name`).
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_leave_the_url_and_the_rest_stays() {
        let (rest, mode, root) = take_tls_parameters(
            "postgres://u@h:5/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?application_name=x");
        assert_eq!(mode, Some(SslMode::VerifyFull));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, root) =
            take_tls_parameters("host=h user=u sslmode=require dbname=d").unwrap();
        assert_eq!(rest, "host=h user=u dbname=d");
        assert_eq!(mode, Some(SslMode::Require));
        assert_eq!(root, None);
        let (rest, mode, _) = take_tls_parameters("postgres://h/db").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://h/db", None));
    }

    #[test]
    fn an_unknown_mode_or_an_unreadable_ca_is_refused_at_start() {
        let bad = Connector::from_url("postgres://h/db?sslmode=verify")
            .err()
            .unwrap();
        assert!(bad.to_string().contains("sslmode=\"verify\""), "{bad}");
        let missing = Connector::from_url(
            "postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
        )
        .err()
        .unwrap();
        assert!(
            missing.to_string().contains("/nonexistent/ca.pem"),
            "{missing}"
        );
    }

    #[test]
    fn each_mode_picks_its_wire_mode_and_verification() {
        let wire = |url: &str| {
            let connector = Connector::from_url(url).unwrap();
            (connector.config.get_ssl_mode(), connector.tls.is_some())
        };
        assert_eq!(wire("postgres://h/db"), (WireMode::Prefer, true));
        assert_eq!(
            wire("postgres://h/db?sslmode=disable"),
            (WireMode::Disable, false)
        );
        assert_eq!(
            wire("postgres://h/db?sslmode=require"),
            (WireMode::Require, true)
        );
        assert_eq!(
            wire("postgres://h/db?sslmode=verify-full"),
            (WireMode::Require, true)
        );
    }
}

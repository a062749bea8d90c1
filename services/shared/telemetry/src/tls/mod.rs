//! gRPC between the services over TLS, and mutual TLS, on rustls (ring):
//! the flags every binary shares, the server's incoming connections and
//! the clients' connector.
//!
//! | flag / variable | meaning |
//! |---|---|
//! | `--tls-cert` `CLAWGATE_TLS_CERT` | this process's certificate chain (PEM): served as a server, presented as a client |
//! | `--tls-key` `CLAWGATE_TLS_KEY` | its private key (PEM) |
//! | `--tls-client-ca` `CLAWGATE_TLS_CLIENT_CA` | the server requires client certificates signed by these CAs (mTLS) |
//! | `--tls-ca` `CLAWGATE_TLS_CA` | the CAs a client verifies servers with (unset: the Mozilla roots) |
//!
//! A server with a certificate serves TLS only; a client uses TLS for the
//! addresses written `https://…`, plaintext for `http://…`. Every file is
//! re-read when it changes ([`reload`]): a rotated certificate serves the
//! next connection without a restart.

pub mod client;
pub mod reload;
pub mod server;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;

pub use client::ClientTls;
pub use server::{Incoming, ServerTls, incoming};

/// The ALPN protocol of gRPC.
const ALPN_H2: &[u8] = b"h2";

/// `--tls-handshake-timeout`'s default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// `--tls-max-handshakes`' default.
pub const DEFAULT_MAX_HANDSHAKES: u32 = 256;

/// The TLS settings of one process (every binary, the same names).
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// This process's certificate chain, PEM: the server serves TLS with
    /// it, and clients present it (mTLS). Re-read when it changes.
    #[arg(long, env = "CLAWGATE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert`, PEM.
    #[arg(long, env = "CLAWGATE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates, PEM: the server requires a client certificate
    /// signed by one of them (mutual TLS). Needs `--tls-cert`.
    #[arg(long, env = "CLAWGATE_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// CA certificates, PEM, a client verifies `https://` servers with;
    /// unset, the Mozilla roots compiled in.
    #[arg(long, env = "CLAWGATE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A TLS handshake not done within this is dropped (e.g. 10s).
    #[arg(long, env = "CLAWGATE_TLS_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = clawgate_common::parse_duration)]
    pub tls_handshake_timeout: Duration,
    /// Most TLS handshakes in progress at once; past it, new connections
    /// wait in the listen backlog.
    #[arg(long, env = "CLAWGATE_TLS_MAX_HANDSHAKES", default_value_t = DEFAULT_MAX_HANDSHAKES,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tls_max_handshakes: u32,
}

/// The defaults of the flags: no TLS.
impl Default for TlsArgs {
    fn default() -> Self {
        Self {
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_ca: None,
            tls_handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            tls_max_handshakes: DEFAULT_MAX_HANDSHAKES,
        }
    }
}

impl TlsArgs {
    /// The server's TLS; `None`: plaintext. A client CA without a
    /// certificate, or a file that does not load, is an error.
    pub fn server(&self) -> Result<Option<ServerTls>, String> {
        match self.identity()? {
            Some((cert, key)) => ServerTls::new(
                cert,
                key,
                self.tls_client_ca.clone(),
                self.tls_handshake_timeout,
                self.tls_max_handshakes as usize,
            )
            .map(Some),
            None if self.tls_client_ca.is_some() => Err(
                "--tls-client-ca (CLAWGATE_TLS_CLIENT_CA) needs --tls-cert and --tls-key: \
                 a server asks for client certificates only over TLS"
                    .into(),
            ),
            None => Ok(None),
        }
    }

    /// This process's certificate and key; one without the other is an
    /// error (checked here rather than by the parser, whose `requires`
    /// would not survive the all-in-one's renaming of the flags).
    fn identity(&self) -> Result<Option<(PathBuf, PathBuf)>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some((cert.clone(), key.clone()))),
            (None, None) => Ok(None),
            _ => Err(
                "--tls-cert and --tls-key (CLAWGATE_TLS_CERT, CLAWGATE_TLS_KEY) go \
                      together: give both or neither"
                    .into(),
            ),
        }
    }

    /// The clients' TLS: the CAs servers are verified with, and the
    /// certificate presented when there is one.
    pub fn client(&self) -> Result<ClientTls, String> {
        ClientTls::new(self.tls_ca.clone(), self.identity()?)
    }

    /// Whether the server requires client certificates: mTLS, a way to
    /// authenticate callers (`service_auth::check_exposure`).
    pub fn mutual(&self) -> bool {
        self.tls_cert.is_some() && self.tls_client_ca.is_some()
    }
}

/// ring, as the store's PostgreSQL TLS uses; rustls deprecates it for
/// lacking post-quantum key exchange, whose provider (aws-lc-rs) would add
/// a large C build.
#[allow(deprecated)]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The serial number of a DER certificate, in hex (for logs and tests),
/// read from its `tbsCertificate` without a full X.509 parser.
pub fn serial_hex(cert: &CertificateDer<'_>) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version
    // OPTIONAL, serialNumber INTEGER, … }, … }
    let (certificate, _) = der_element(cert.as_ref(), 0x30)?;
    let (mut tbs, _) = der_element(certificate, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = der_element(tbs, 0xa0)?.1;
    }
    let (serial, _) = der_element(tbs, 0x02)?;
    let start = serial.iter().position(|&b| b != 0).unwrap_or(serial.len());
    Some(serial[start..].iter().map(|b| format!("{b:02x}")).collect())
}

/// The content of the DER element of `tag` at the start of `bytes`, and
/// what follows it.
fn der_element(bytes: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = bytes.split_first()?;
    if first != tag {
        return None;
    }
    let (&length, mut rest) = rest.split_first()?;
    let length = match length {
        short if short < 0x80 => usize::from(short),
        long => {
            let count = usize::from(long & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (digits, after) = rest.split_at(count);
            rest = after;
            digits
                .iter()
                .fold(0usize, |n, &d| (n << 8) | usize::from(d))
        }
    };
    (rest.len() >= length).then(|| rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::testing::{Ca, hex};
    use super::*;

    #[test]
    fn the_serial_is_read_from_the_certificate() {
        let ca = Ca::new("serial CA");
        for serial in [1u64, 0x80, 0x1234_5678_9abc] {
            let leaf = ca.leaf("leaf", serial);
            assert_eq!(serial_hex(&leaf.der()), Some(hex(serial)));
        }
        assert_eq!(serial_hex(&CertificateDer::from(vec![0x30, 0x05])), None);
    }

    #[test]
    fn a_client_ca_without_a_certificate_is_refused() {
        let args = TlsArgs {
            tls_client_ca: Some("/ca.pem".into()),
            ..TlsArgs::default()
        };
        assert!(args.server().err().unwrap().contains("--tls-cert"));
        assert!(!args.mutual());
        assert!(TlsArgs::default().server().unwrap().is_none());
        let half = TlsArgs {
            tls_cert: Some("/cert.pem".into()),
            ..TlsArgs::default()
        };
        assert!(half.server().err().unwrap().contains("give both"));
        assert!(half.client().err().unwrap().contains("give both"));
    }
}

//! Test CAs and certificates (rcgen), for the unit tests here, the system
//! tests and the benchmark's TLS topologies (feature `testing`).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SerialNumber,
};
use rustls::pki_types::CertificateDer;

/// A CA that signs certificates for loopback (`localhost`, `127.0.0.1`,
/// `::1`) usable both as server and as client.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("a self-signed CA");
        Self { cert, key }
    }

    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate to `dir/ca.pem`; its path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.cert_pem()).expect("writing ca.pem");
        path
    }

    /// A certificate named `name` with serial number `serial`.
    pub fn leaf(&self, name: &str, serial: u64) -> Leaf {
        let names = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
        let mut params = CertificateParams::new(names).expect("leaf parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("a signed leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Writes `dir/cert.pem` and `dir/key.pem`; their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, &self.cert_pem).expect("writing cert.pem");
        std::fs::write(&key, &self.key_pem).expect("writing key.pem");
        (cert, key)
    }

    /// The certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("the leaf's PEM")
    }
}

/// What [`serial_hex`](super::serial_hex) reads from a certificate made
/// with `serial`.
pub fn hex(serial: u64) -> String {
    let bytes = serial.to_be_bytes();
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    bytes[start..].iter().map(|b| format!("{b:02x}")).collect()
}

/// The serial of `cert` as a number (the certificates made here).
pub fn serial_of(cert: &CertificateDer<'_>) -> u64 {
    let hex = super::serial_hex(cert).expect("a certificate with a serial");
    u64::from_str_radix(&hex, 16).expect("a serial made here")
}

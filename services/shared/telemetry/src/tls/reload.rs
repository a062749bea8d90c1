//! Files read again when they change: a certificate with its key, or a CA
//! bundle, kept parsed in memory and re-read at the next handshake after
//! their modification time (or length) changed — cert-manager rewrites a
//! Secret's files in place, and a new connection must use the new ones
//! without a restart.
//!
//! The files are looked at (a `stat` each) at most once per
//! [`CHECK_INTERVAL`], so a busy server pays for it once a second, not per
//! handshake. A new file that does not load (half written, a key that does
//! not match its certificate, not PEM) leaves the last good one in use and
//! is logged, at most a line a second; it is tried again at the next look,
//! so the write that completes it is picked up.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, SignatureScheme};

/// How often the files are looked at for a change, at most.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies one version of a file: when it was last written and
/// its length (two writes within the clock's resolution rarely keep both).
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// How a [`Reloading`] value is made from its files.
pub type Load<T> = Box<dyn Fn(&[PathBuf]) -> Result<T, String> + Send + Sync>;

/// A value made from files, made again when they change.
pub struct Reloading<T> {
    what: &'static str,
    files: Vec<PathBuf>,
    load: Load<T>,
    interval: Duration,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: T,
    stamps: Vec<Stamp>,
    checked: Instant,
}

impl<T: Clone> Reloading<T> {
    /// Loads `files` now: a file that cannot be loaded at start is an
    /// error (`what` names them in it), not a server without a certificate.
    pub fn new(
        what: &'static str,
        files: Vec<PathBuf>,
        load: Load<T>,
        interval: Duration,
    ) -> Result<Self, String> {
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let current = load(&files).map_err(|e| format!("{what}: {e}"))?;
        Ok(Self {
            what,
            files,
            load,
            interval,
            state: Mutex::new(State {
                current,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The value from the files as they are now (as of the last look, at
    /// most [`CHECK_INTERVAL`] ago).
    pub fn current(&self) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= self.interval {
            state.checked = Instant::now();
            let stamps: Vec<Stamp> = self.files.iter().map(|f| stamp(f)).collect();
            if stamps != state.stamps {
                match (self.load)(&self.files) {
                    Ok(value) => {
                        state.current = value;
                        state.stamps = stamps;
                        tracing::info!(what = self.what, "TLS files changed; reloaded");
                    }
                    Err(error) => crate::limited!(
                        warn,
                        what = self.what,
                        %error,
                        "TLS files changed but do not load; the last good ones stay in use"
                    ),
                }
            }
        }
        state.current.clone()
    }
}

/// A certificate verifier trusting the CAs of `ca` (`what` names the
/// flag), rebuilt by `build` when the file changes; and the signature
/// schemes of `provider`, which stay whatever the CAs.
pub fn verifier<V: Clone + Send + 'static>(
    what: &'static str,
    ca: PathBuf,
    provider: Arc<CryptoProvider>,
    build: fn(Arc<RootCertStore>, Arc<CryptoProvider>) -> Result<V, String>,
) -> Result<(Reloading<V>, Vec<SignatureScheme>), String> {
    let schemes = provider
        .signature_verification_algorithms
        .supported_schemes();
    let load = move |files: &[PathBuf]| {
        build(roots(files)?, provider.clone()).map_err(|e| format!("{}: {e}", files[0].display()))
    };
    Ok((
        Reloading::new(what, vec![ca], Box::new(load), CHECK_INTERVAL)?,
        schemes,
    ))
}

/// Reads every PEM certificate of `path`; none is an error.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match certs.is_empty() {
        true => Err(format!(
            "{}: no PEM certificate in the file",
            path.display()
        )),
        false => Ok(certs),
    }
}

/// A certificate chain (`files[0]`) and its private key (`files[1]`),
/// checked to belong together.
pub fn certified_key(
    provider: Arc<CryptoProvider>,
) -> impl Fn(&[PathBuf]) -> Result<Arc<CertifiedKey>, String> + Send + Sync {
    move |files| {
        let chain = read_certificates(&files[0])?;
        let key = PrivateKeyDer::from_pem_file(&files[1])
            .map_err(|e| format!("{}: {e}", files[1].display()))?;
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| format!("{} and {}: {e}", files[0].display(), files[1].display()))?;
        Ok(Arc::new(certified))
    }
}

/// The CA certificates of `files[0]`, as trust roots.
pub fn roots(files: &[PathBuf]) -> Result<Arc<RootCertStore>, String> {
    let mut store = RootCertStore::empty();
    for cert in read_certificates(&files[0])? {
        store
            .add(cert)
            .map_err(|e| format!("{}: {e}", files[0].display()))?;
    }
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::provider;
    use crate::tls::testing::{Ca, serial_of};

    fn key_reloader(dir: &Path) -> Reloading<Arc<CertifiedKey>> {
        Reloading::new(
            "test certificate",
            vec![dir.join("cert.pem"), dir.join("key.pem")],
            Box::new(certified_key(provider())),
            Duration::ZERO,
        )
        .unwrap()
    }

    #[test]
    fn a_changed_certificate_is_used_and_a_bad_one_leaves_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("reload CA");
        let first = ca.leaf("first", 1001);
        first.write(dir.path());
        let reloading = key_reloader(dir.path());
        assert_eq!(serial_of(&reloading.current().cert[0]), 1001);

        let second = ca.leaf("second", 2002);
        second.write(dir.path());
        assert_eq!(serial_of(&reloading.current().cert[0]), 2002, "re-read");

        // Half a rotation: the new certificate beside the old key.
        let third = ca.leaf("third", 3003);
        std::fs::write(dir.path().join("cert.pem"), &third.cert_pem).unwrap();
        assert_eq!(
            serial_of(&reloading.current().cert[0]),
            2002,
            "a key that does not match keeps the last good pair"
        );
        std::fs::write(dir.path().join("key.pem"), &third.key_pem).unwrap();
        assert_eq!(
            serial_of(&reloading.current().cert[0]),
            3003,
            "the completed rotation is picked up"
        );

        std::fs::write(dir.path().join("cert.pem"), "not a certificate\n").unwrap();
        assert_eq!(serial_of(&reloading.current().cert[0]), 3003);
        std::fs::remove_file(dir.path().join("key.pem")).unwrap();
        assert_eq!(serial_of(&reloading.current().cert[0]), 3003);
    }

    #[test]
    fn files_that_do_not_load_at_start_are_an_error_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Reloading::new(
            "the server certificate",
            vec![dir.path().join("cert.pem"), dir.path().join("key.pem")],
            Box::new(certified_key(provider())),
            Duration::ZERO,
        )
        .err()
        .unwrap();
        assert!(missing.starts_with("the server certificate: "), "{missing}");
        assert!(missing.contains("cert.pem"), "{missing}");

        std::fs::write(dir.path().join("ca.pem"), "no PEM here\n").unwrap();
        let empty = roots(&[dir.path().join("ca.pem")]).unwrap_err();
        assert!(empty.contains("no PEM certificate"), "{empty}");

        let ca = Ca::new("one CA");
        let other = Ca::new("another CA");
        ca.leaf("mine", 7).write(dir.path());
        std::fs::write(dir.path().join("key.pem"), other.leaf("theirs", 8).key_pem).unwrap();
        let mismatch =
            certified_key(provider())(&[dir.path().join("cert.pem"), dir.path().join("key.pem")])
                .err()
                .unwrap();
        assert!(mismatch.contains("key"), "{mismatch}");
    }

    #[test]
    fn the_files_are_looked_at_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("interval CA");
        ca.leaf("first", 1).write(dir.path());
        let reloading = Reloading::new(
            "test certificate",
            vec![dir.path().join("cert.pem"), dir.path().join("key.pem")],
            Box::new(certified_key(provider())),
            Duration::from_secs(3600),
        )
        .unwrap();
        ca.leaf("second", 2).write(dir.path());
        assert_eq!(
            serial_of(&reloading.current().cert[0]),
            1,
            "not looked at again within the interval"
        );
    }
}

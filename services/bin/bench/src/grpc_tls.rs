//! The split topology's gRPC hops over TLS or mutual TLS: a test CA and a
//! certificate per service made with rcgen in a temporary folder, given to
//! the processes through the `CLAWGATE_TLS_*` variables (docs/grpc-tls.md).

use std::path::PathBuf;

use clawgate_telemetry::tls::testing::Ca;
use tokio::process::Command;

/// How the split topology's services talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcTls {
    Off,
    /// Servers present certificates; clients verify them.
    Tls,
    /// As `Tls`, and servers require client certificates.
    Mutual,
}

/// The certificates of one system, removed with it.
pub struct TlsFiles {
    dir: tempfile::TempDir,
    mutual: bool,
}

impl GrpcTls {
    /// The files this mode needs (none for `Off`).
    pub fn files(self) -> anyhow::Result<Option<TlsFiles>> {
        if self == Self::Off {
            return Ok(None);
        }
        let dir = tempfile::tempdir()?;
        let ca = Ca::new("clawgate-bench CA");
        ca.write(dir.path());
        for (serial, service) in (1..).zip(["store", "coordinator", "edge"]) {
            let folder = dir.path().join(service);
            std::fs::create_dir(&folder)?;
            ca.leaf(service, serial).write(&folder);
        }
        Ok(Some(TlsFiles {
            dir,
            mutual: self == Self::Mutual,
        }))
    }
}

impl TlsFiles {
    /// Gives `service` (`store`, `coordinator` or `edge`) its certificate,
    /// the CA, and for mTLS the client CA.
    pub fn apply(&self, command: &mut Command, service: &str) {
        let file = |name: &str| -> PathBuf { self.dir.path().join(service).join(name) };
        let ca = self.dir.path().join("ca.pem");
        command
            .env("CLAWGATE_TLS_CERT", file("cert.pem"))
            .env("CLAWGATE_TLS_KEY", file("key.pem"))
            .env("CLAWGATE_TLS_CA", &ca);
        if self.mutual {
            command.env("CLAWGATE_TLS_CLIENT_CA", &ca);
        }
    }
}

/// The address of a gRPC server at `address`, over TLS when `files` are.
pub fn url(files: Option<&TlsFiles>, address: std::net::SocketAddr) -> String {
    match files {
        Some(_) => format!("https://{address}"),
        None => format!("http://{address}"),
    }
}

//! The store's connections to PostgreSQL over TLS (rustls), `sslmode` as
//! libpq means it: `require` against the local PostgreSQL (`ssl = on`,
//! Debian's snake-oil certificate) shows `ssl = t` in `pg_stat_ssl` for
//! every connection of the store, `disable` shows `f`; `verify-full` and
//! `verify-ca` against a cluster of the test's own, whose certificate a CA
//! made here signed: the right CA connects, another CA is refused with the
//! reason, and a name that is not on the certificate passes `verify-ca`
//! only.

use clawgate_system_tests::pg_cluster::PgCluster;
use clawgate_system_tests::postgres::{drop_schema, fresh_schema, postgres_url};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use session_store::SessionStore;
use session_store::backend::postgres::{PgOptions, PostgresStore};
use tokio_postgres::NoTls;

/// `url` with `params` added to its query.
fn with_params(url: &str, params: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// Connects a store to `url` in a schema of its own, runs one call, and
/// answers whether each of its connections is encrypted, as the server sees
/// them (`pg_stat_ssl`, by the application name the URL gives).
async fn store_connections_encrypted(server: &str, url: &str) -> Result<Vec<bool>, String> {
    let application = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let schema = fresh_schema("tls");
    let options = PgOptions {
        schema: Some(schema.clone()),
        pool_size: 2,
        admission_pool_size: 0,
        ..PgOptions::default()
    };
    let url = with_params(url, &format!("application_name={application}"));
    let store = match PostgresStore::connect(&url, options).await {
        Ok(store) => store,
        Err(refused) => return Err(refused.to_string()),
    };
    store
        .get_run("nothing-here")
        .await
        .map_err(|e| e.to_string())?;
    let (client, connection) = server
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    drop(store);
    drop_schema(server, &schema).await;
    Ok(rows.iter().map(|row| row.get::<_, bool>(0)).collect())
}

#[tokio::test]
async fn require_encrypts_every_connection_and_disable_none() {
    let server = postgres_url();
    let encrypted = store_connections_encrypted(&server, &with_params(&server, "sslmode=require"))
        .await
        .expect("the store connects with sslmode=require");
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|&ssl| ssl),
        "every connection of the store is encrypted: {encrypted:?}"
    );
    let plain = store_connections_encrypted(&server, &with_params(&server, "sslmode=disable"))
        .await
        .expect("the store connects with sslmode=disable");
    assert!(
        !plain.is_empty() && plain.iter().all(|&ssl| !ssl),
        "no connection is encrypted: {plain:?}"
    );
    // The default is libpq's: `prefer`, encrypted when the server offers it.
    let default = store_connections_encrypted(&server, &server).await.unwrap();
    assert!(
        !default.is_empty() && default.iter().all(|&ssl| ssl),
        "{default:?}"
    );
}

/// A certificate authority of the test's own.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A server certificate for `names` (DNS names or IP addresses) and its
    /// key, both PEM.
    fn server_certificate(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "clawgate test PostgreSQL");
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A PostgreSQL cluster of the test's own serving TLS with `cert` and `key`.
async fn cluster_serving(cert: String, key: String) -> PgCluster {
    PgCluster::builder()
        .setting("ssl", "on")
        .setting("ssl_cert_file", "server.crt")
        .setting("ssl_key_file", "server.key")
        .file("server.crt", cert)
        .file("server.key", key)
        .start()
        .await
}

#[tokio::test]
async fn verify_full_trusts_only_its_ca_and_the_name_on_the_certificate() {
    let authority = Authority::new("clawgate test CA");
    // Issued for 127.0.0.1 and localhost: the cluster's URL names the
    // address, so `verify-full` passes on it.
    let (cert, key) = authority.server_certificate(&["127.0.0.1", "localhost"]);
    let cluster = cluster_serving(cert, key).await;
    let folder = tempfile::tempdir().unwrap();
    let right_ca = folder.path().join("right-ca.pem");
    std::fs::write(&right_ca, authority.cert.pem()).unwrap();
    let wrong_ca = folder.path().join("wrong-ca.pem");
    std::fs::write(&wrong_ca, Authority::new("another CA").cert.pem()).unwrap();
    let server = cluster.url();
    let url = |mode: &str, ca: &std::path::Path| {
        with_params(
            &server,
            &format!("sslmode={mode}&sslrootcert={}", ca.display()),
        )
    };

    let encrypted = store_connections_encrypted(&server, &url("verify-full", &right_ca))
        .await
        .unwrap_or_else(|e| panic!("verify-full with the right CA: {e}\n{}", cluster.log()));
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|&ssl| ssl),
        "{encrypted:?}"
    );

    let refused = store_connections_encrypted(&server, &url("verify-full", &wrong_ca))
        .await
        .expect_err("a server certificate from another CA is refused");
    assert!(
        refused.contains("certificate") && refused.contains("UnknownIssuer"),
        "the refusal says why: {refused}"
    );
    // `require` with a root file checks the chain, as libpq does.
    let refused = store_connections_encrypted(&server, &url("require", &wrong_ca))
        .await
        .expect_err("require with sslrootcert checks the chain");
    assert!(refused.contains("UnknownIssuer"), "{refused}");
}

#[tokio::test]
async fn verify_ca_checks_the_chain_and_not_the_name() {
    let authority = Authority::new("clawgate test CA");
    // Issued for another host only.
    let (cert, key) = authority.server_certificate(&["db.example.internal"]);
    let cluster = cluster_serving(cert, key).await;
    let folder = tempfile::tempdir().unwrap();
    let ca = folder.path().join("ca.pem");
    std::fs::write(&ca, authority.cert.pem()).unwrap();
    let server = cluster.url();
    let url = |mode: &str| {
        with_params(
            &server,
            &format!("sslmode={mode}&sslrootcert={}", ca.display()),
        )
    };
    let encrypted = store_connections_encrypted(&server, &url("verify-ca"))
        .await
        .unwrap_or_else(|e| panic!("verify-ca: {e}\n{}", cluster.log()));
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|&ssl| ssl),
        "{encrypted:?}"
    );
    let refused = store_connections_encrypted(&server, &url("verify-full"))
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    assert!(
        refused.contains("certificate"),
        "the refusal says why: {refused}"
    );
}

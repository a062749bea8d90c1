//! gRPC over mutual TLS on every hop: the three real processes, each with
//! its own certificate from one CA and requiring client certificates from
//! it, serve a chat end to end through the edge, the coordinator executing
//! it on an external gRPC runtime over mutual TLS too; a gRPC caller without a
//! certificate, with one from another CA, or in plaintext is refused at
//! the handshake and writes nothing; and a certificate replaced on disk
//! is served to the next connection without a restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as coordinator_pb;
use clawgate_proto::session_store::v1 as store_pb;
use clawgate_system_tests::client::{Client, OPERATOR_SCOPES, TOKEN};
use clawgate_system_tests::process::{Process, binary_path, refused_start, service_command};
use clawgate_system_tests::runtime::CountingRuntime;
use clawgate_system_tests::system::Role;
use clawgate_system_tests::wait::poll;
use clawgate_telemetry::tls::testing::{Ca, hex};
use clawgate_telemetry::tls::{ClientTls, ServerTls, serial_hex};
use coordinator_pb::run_coordinator_client::RunCoordinatorClient;
use serde_json::json;
use store_pb::session_store_client::SessionStoreClient;
use tonic::transport::{Channel, Endpoint};

/// One process's certificate files, in a folder of its own.
struct Identity {
    dir: PathBuf,
}

impl Identity {
    fn new(root: &Path, name: &str, ca: &Ca, serial: u64) -> Self {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        ca.leaf(name, serial).write(&dir);
        Self { dir }
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    /// A client of the services: the cluster CA, this certificate.
    fn client(&self, ca: &Path) -> ClientTls {
        ClientTls::new(Some(ca.to_owned()), Some((self.cert(), self.key()))).unwrap()
    }
}

/// Starts `role` serving (and calling) over mutual TLS with `identity`.
async fn start(role: Role, identity: &Identity, ca: &Path, flags: &[String]) -> Process {
    let mut command = service_command(binary_path(role.binary()));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(flags)
        .env("CLAWGATE_TLS_CERT", identity.cert())
        .env("CLAWGATE_TLS_KEY", identity.key())
        .env("CLAWGATE_TLS_CLIENT_CA", ca)
        .env("CLAWGATE_TLS_CA", ca);
    Process::start(command, role.binary(), role.ready_message()).await
}

fn https(process: &Process) -> String {
    format!("https://{}", process.address)
}

async fn channel(url: String, tls: &ClientTls) -> Channel {
    let endpoint = Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    tls.lazy_channel(&endpoint)
}

struct Cluster {
    ca_file: PathBuf,
    store: Process,
    coordinator: Process,
    edge: Process,
    store_identity: Identity,
    operator: Identity,
    _files: tempfile::TempDir,
}

impl Cluster {
    /// The three processes, the coordinator executing with the echo
    /// runtime, or with the gRPC runtime at `runtime`.
    async fn start(ca: &Ca, runtime: Option<&str>) -> Self {
        let files = tempfile::tempdir().unwrap();
        let ca_file = ca.write(files.path());
        let store_identity = Identity::new(files.path(), "store", ca, 100);
        let coordinator_identity = Identity::new(files.path(), "coordinator", ca, 200);
        let edge_identity = Identity::new(files.path(), "edge", ca, 300);
        let operator = Identity::new(files.path(), "operator", ca, 400);
        let data = files.path().join("store.redb");
        let store_flags = ["--store".into(), data.to_string_lossy().into_owned()];
        let store = start(Role::Store, &store_identity, &ca_file, &store_flags).await;
        let runtime_flags = match runtime {
            Some(url) => ["grpc", "--runtime-address", url],
            None => ["echo", "--echo-chunks", "2"],
        };
        let coordinator_flags: Vec<String> = ["--store-address", &https(&store), "--runtime"]
            .iter()
            .chain(&runtime_flags)
            .map(|flag| flag.to_string())
            .collect();
        let coordinator = start(
            Role::Coordinator,
            &coordinator_identity,
            &ca_file,
            &coordinator_flags,
        )
        .await;
        let edge_flags = [
            "--coordinator-address",
            &https(&coordinator),
            "--store-address",
            &https(&store),
            "--auth-mode",
            "token",
            "--token",
            TOKEN,
        ]
        .map(str::to_owned);
        let edge = start(Role::Edge, &edge_identity, &ca_file, &edge_flags).await;
        clawgate_system_tests::process::until_ready(edge.address, || edge.output_text()).await;
        Self {
            ca_file,
            store,
            coordinator,
            edge,
            store_identity,
            operator,
            _files: files,
        }
    }

    /// Sends `message` through the edge and waits for its final event;
    /// the client, for more.
    async fn chat(&self, session: &str, message: &str, run: &str) -> Client {
        let url = format!("ws://{}", self.edge.address);
        let mut client = Client::connect(&url, OPERATOR_SCOPES).await;
        let params = json!({ "sessionKey": session, "message": message, "idempotencyKey": run });
        let sent = client.request("chat.send", params).await;
        assert_eq!(sent["ok"], true, "{sent}\n{}", self.output());
        let end = client.chat_end(run).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
        client
    }

    fn output(&self) -> String {
        [&self.store, &self.coordinator, &self.edge]
            .iter()
            .map(|p| p.output_text())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A call refused at the TLS handshake: the connection failed, so the
/// error is the client's transport's, never an answer of the server. Its
/// code is the client library's reading of the failure: TLS 1.3 tells a
/// client its certificate was refused only after its side of the
/// handshake is done, so tonic reports the server's alert, or the close
/// after it, on the first read (UNKNOWN or CANCELLED rather than
/// UNAVAILABLE); a plaintext client reads the alert as a bad HTTP/2 frame
/// (INTERNAL).
fn assert_refused(who: &str, refused: &tonic::Status) {
    use std::error::Error as _;
    let transport = refused
        .source()
        .is_some_and(|source| source.is::<tonic::transport::Error>());
    assert!(transport, "{who}: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hop_over_mutual_tls_and_callers_without_a_good_certificate_are_refused() {
    let ca = Ca::new("clawgate test CA");
    // The external runtime the coordinator calls, on mTLS too.
    let runtime_files = tempfile::tempdir().unwrap();
    let runtime_ca = ca.write(runtime_files.path());
    let runtime_identity = Identity::new(runtime_files.path(), "runtime", &ca, 250);
    let runtime_tls = ServerTls::new(
        runtime_identity.cert(),
        runtime_identity.key(),
        Some(runtime_ca),
        Duration::from_secs(10),
        16,
    )
    .unwrap();
    let runtime = CountingRuntime::start_tls(Duration::ZERO, runtime_tls).await;
    let cluster = Cluster::start(&ca, Some(&runtime.url())).await;

    // A chat end to end: edge → coordinator → store, coordinator → the
    // runtime, all mTLS.
    let mut client = cluster.chat("over-tls", "hello", "tls-1").await;
    assert_eq!(runtime.executions().get("tls-1"), Some(&1));
    let history = client
        .request("chat.history", json!({ "sessionKey": "over-tls" }))
        .await;
    assert_eq!(history["ok"], true, "{history}");
    assert!(
        history.to_string().contains("echo: hello"),
        "the runtime's reply went through the store: {history}"
    );

    // Callers the servers must refuse at the handshake.
    let files = tempfile::tempdir().unwrap();
    let stranger_ca = Ca::new("another CA");
    let stranger = Identity::new(files.path(), "stranger", &stranger_ca, 500);
    let callers = [
        (
            "no client certificate",
            ClientTls::new(Some(cluster.ca_file.clone()), None).unwrap(),
            "https",
        ),
        (
            "a certificate of another CA",
            stranger.client(&cluster.ca_file),
            "https",
        ),
        ("plaintext", ClientTls::system().clone(), "http"),
    ];
    for (who, tls, scheme) in &callers {
        let store_url = format!("{scheme}://{}", cluster.store.address);
        let mut store = SessionStoreClient::new(channel(store_url, tls).await);
        let patch = store_pb::PatchSessionRequest {
            session_key: "intruder".into(),
            patch_json: r#"{"label":"written by a stranger"}"#.into(),
            ..Default::default()
        };
        let refused = store.patch_session(patch).await.expect_err(who);
        assert_refused(who, &refused);
        let coordinator_url = format!("{scheme}://{}", cluster.coordinator.address);
        let mut coordinator = RunCoordinatorClient::new(channel(coordinator_url, tls).await);
        let submit = coordinator_pb::SubmitRequest {
            run_id: format!("intruder-{scheme}-{}", who.len()),
            session_key: "intruder".into(),
            kind: "chat".into(),
            message: "let me in".into(),
            ..Default::default()
        };
        let refused = coordinator.submit(submit).await.expect_err(who);
        assert_refused(who, &refused);
    }

    let logged = poll(
        "the refused handshakes to be logged",
        Duration::from_secs(30),
        async || {
            cluster
                .store
                .output_text()
                .contains("gRPC TLS handshake failed")
        },
    )
    .await;
    if let Err(timed_out) = logged {
        panic!("{timed_out}\n{}", cluster.output());
    }

    // Nothing of theirs was written; a caller with a good certificate is
    // served.
    let operator = cluster.operator.client(&cluster.ca_file);
    let mut store = SessionStoreClient::new(channel(https(&cluster.store), &operator).await);
    let intruder = store
        .get_session(store_pb::GetSessionRequest {
            session_key: "intruder".into(),
        })
        .await
        .expect("a caller with a certificate of the CA is served")
        .into_inner();
    assert_eq!(intruder.session, None, "nothing was written");
    let ours = store
        .get_session(store_pb::GetSessionRequest {
            session_key: "over-tls".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ours.session.is_some(), "{ours:?}");
}

/// The certificate `address` serves to a TLS client of the CA.
async fn served_serial(tls: &ClientTls, address: SocketAddr) -> Option<String> {
    tls.handshake(address)
        .await
        .ok()
        .and_then(|cert| serial_hex(&cert))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_serves_new_connections_without_a_restart() {
    let ca = Ca::new("rotating CA");
    let cluster = Cluster::start(&ca, None).await;
    let operator = cluster.operator.client(&cluster.ca_file);
    let address = cluster.store.address;
    assert_eq!(served_serial(&operator, address).await, Some(hex(100)));

    // cert-manager renews: a new certificate of the same CA, written over
    // the old files.
    ca.leaf("store renewed", 101)
        .write(&cluster.store_identity.dir);
    let renewed = poll(
        "the renewed certificate to be served",
        Duration::from_secs(30),
        async || served_serial(&operator, address).await == Some(hex(101)),
    )
    .await;
    if let Err(timed_out) = renewed {
        panic!("{timed_out}\n{}", cluster.output());
    }

    // A file that does not load leaves the renewed one in use.
    std::fs::write(cluster.store_identity.cert(), "half a certificate\n").unwrap();
    let log_line = "TLS files changed but do not load";
    let logged = poll(
        "the bad file to be logged",
        Duration::from_secs(30),
        async || {
            let _ = served_serial(&operator, address).await;
            cluster.store.output_text().contains(log_line)
        },
    )
    .await;
    if let Err(timed_out) = logged {
        panic!("{timed_out}\n{}", cluster.output());
    }
    assert_eq!(served_serial(&operator, address).await, Some(hex(101)));

    // The processes never restarted: the chat still runs through them.
    cluster.chat("after-rotation", "still here", "rot-1").await;
}

/// Mutual TLS authenticates callers: a store or coordinator beyond loopback
/// with a client CA starts without a service token; with a certificate but
/// no client CA (anyone may call) it still refuses, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_counts_as_authentication_beyond_loopback() {
    let files = tempfile::tempdir().unwrap();
    let ca = Ca::new("exposure CA");
    let ca_file = ca.write(files.path());
    let identity = Identity::new(files.path(), "server", &ca, 600);
    let data = files.path().join("store.redb");
    let flags = |role: Role| -> Vec<String> {
        let mut flags = vec!["--listen".into(), "0.0.0.0:0".into()];
        flags.extend(["--metrics-listen".into(), "127.0.0.1:0".into()]);
        match role {
            Role::Store => flags.extend(["--store".into(), data.to_string_lossy().into()]),
            _ => flags.extend(["--store-address".into(), "https://127.0.0.1:9".into()]),
        }
        flags
    };
    for role in [Role::Store, Role::Coordinator] {
        let command = |mutual: bool| {
            let mut command = service_command(binary_path(role.binary()));
            command
                .args(flags(role))
                .env("CLAWGATE_TLS_CERT", identity.cert())
                .env("CLAWGATE_TLS_KEY", identity.key())
                .env("CLAWGATE_TLS_CA", &ca_file);
            if mutual {
                command.env("CLAWGATE_TLS_CLIENT_CA", &ca_file);
            }
            command
        };
        let (status, output) = refused_start(command(false)).await;
        assert!(!status.success(), "{role:?} started:\n{output}");
        assert!(
            output.contains("beyond loopback, with no service token")
                && output.contains("CLAWGATE_TLS_CLIENT_CA"),
            "{role:?}: {output}"
        );
        if role == Role::Store {
            let started = Process::start(command(true), role.binary(), role.ready_message()).await;
            assert!(started.address.ip().is_unspecified(), "{}", started.address);
        }
    }
}

/// A coordinator that does not trust the store's certificate stops at
/// start, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_does_not_trust_the_store_stops_and_says_why() {
    let files = tempfile::tempdir().unwrap();
    let ca = Ca::new("store CA");
    let ca_file = ca.write(files.path());
    let store_identity = Identity::new(files.path(), "store", &ca, 700);
    let data = files.path().join("store.redb");
    let store_flags = ["--store".into(), data.to_string_lossy().into_owned()];
    let store = start(Role::Store, &store_identity, &ca_file, &store_flags).await;

    let other = tempfile::tempdir().unwrap();
    let other_ca = Ca::new("not the store's CA");
    let other_ca_file = other_ca.write(other.path());
    let mut command = service_command(binary_path(Role::Coordinator.binary()));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--store-address", &https(&store)])
        .env("CLAWGATE_TLS_CA", &other_ca_file);
    let (status, output) = refused_start(command).await;
    assert!(!status.success(), "it started:\n{output}");
    assert!(
        output.contains("cannot reach the session store")
            && output.contains("invalid peer certificate"),
        "{output}"
    );
}

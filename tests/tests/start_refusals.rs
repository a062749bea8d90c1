//! A service refuses to start on settings that would leave it open, and
//! says why, naming the setting and never the secret: a shared secret (the
//! edge's token, password or device-token secret, a service token of any
//! kind) shorter than 16 bytes; a store or coordinator listening beyond loopback with no
//! service token; an edge beyond loopback with auth mode `none`, or calling
//! services beyond loopback with no service token. `--insecure` (or
//! `CLAWGATE_INSECURE`) says in so many words to start anyway. Each case is
//! the real binary: a refused one must exit non-zero before it serves.

use clawgate_system_tests::process::{Process, binary_path, refused_start, service_command};
use clawgate_system_tests::system::Role;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::process::Command;

/// 12 bytes: under the 16 a shared secret needs.
const SHORT: &str = "short-secret";
/// Long enough.
const GOOD: &str = "a-good-long-shared-secret";

struct Case {
    binary: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// What the refusal must say.
    says: String,
}

/// `binary` with `args` and `env`; everything else it needs to start is
/// given, so that only the case's setting stops it.
fn case(
    binary: &'static str,
    args: &[&str],
    env: &[(&'static str, &str)],
    says: impl Into<String>,
) -> Case {
    Case {
        binary,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        says: says.into(),
    }
}

/// `case` as a command listening on `listen` (port 0), its metrics on
/// loopback, a store's data in `data`.
fn command(case: &Case, listen: &str, data: &std::path::Path) -> Command {
    let mut command = service_command(binary_path(case.binary));
    command
        .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
        .args(&case.args);
    if case.binary == "session-store" {
        command.args(["--store", &data.join("store.redb").to_string_lossy()]);
    }
    for (key, value) in &case.env {
        command.env(key, value);
    }
    command
}

async fn assert_refused(case: Case, data: &std::path::Path) {
    assert_refused_on("127.0.0.1:0", case, data).await;
}

async fn assert_refused_on(listen: &str, case: Case, data: &std::path::Path) {
    let (status, output) = refused_start(command(&case, listen, data)).await;
    assert!(
        !status.success(),
        "{} {:?} started:\n{output}",
        case.binary,
        case.args
    );
    assert!(
        output.contains(&case.says),
        "{} {:?} does not say {:?}:\n{output}",
        case.binary,
        case.args,
        case.says
    );
    assert!(
        !output.contains(SHORT),
        "{} printed the secret:\n{output}",
        case.binary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_shared_secret_stops_every_binary_at_start() {
    let data = tempfile::tempdir().unwrap();
    let service_token = format!("{GOOD},{SHORT}");
    for case in [
        case(
            "gateway-edge",
            &["--auth-mode", "token"],
            &[("EDGE_TOKEN", SHORT)],
            "EDGE_TOKEN is 12 bytes long: a shared secret needs 16 bytes at least",
        ),
        case(
            "gateway-edge",
            &["--auth-mode", "password"],
            &[("EDGE_PASSWORD", SHORT)],
            "EDGE_PASSWORD is 12 bytes long",
        ),
        case(
            "gateway-edge",
            &["--auth-mode", "token", "--token", GOOD],
            &[("EDGE_DEVICE_TOKEN_SECRET", SHORT)],
            "EDGE_DEVICE_TOKEN_SECRET is 12 bytes long",
        ),
        case(
            "gateway-edge",
            &["--auth-mode", "token", "--token", GOOD],
            &[("CLAWGATE_SERVICE_TOKEN", &service_token)],
            "CLAWGATE_SERVICE_TOKEN (token 2 of 2) is 12 bytes long",
        ),
        case(
            "session-store",
            &[],
            &[("CLAWGATE_SERVICE_TOKEN", SHORT)],
            "CLAWGATE_SERVICE_TOKEN (token 1 of 1) is 12 bytes long",
        ),
        case(
            "run-coordinator",
            &["--store-address", "http://127.0.0.1:9"],
            &[("CLAWGATE_SERVICE_TOKEN", &service_token)],
            "CLAWGATE_SERVICE_TOKEN (token 2 of 2) is 12 bytes long",
        ),
        // The per-kind lists, a session-bound entry's token included.
        case(
            "session-store",
            &[],
            &[(
                "CLAWGATE_INTERNAL_TOKENS",
                &format!("{GOOD}x,agent:x:={SHORT}"),
            )],
            "CLAWGATE_INTERNAL_TOKENS (token 2 of 2) is 12 bytes long",
        ),
        case(
            "run-coordinator",
            &["--store-address", "http://127.0.0.1:9"],
            &[("CLAWGATE_EDGE_TOKENS", &service_token)],
            "CLAWGATE_EDGE_TOKENS (token 2 of 2) is 12 bytes long",
        ),
    ] {
        assert_refused(case, data.path()).await;
    }
}

/// A service on every interface: the wildcard address, port 0.
const ANY: &str = "0.0.0.0:0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_beyond_loopback_with_no_auth_refuses_to_start() {
    let data = tempfile::tempdir().unwrap();
    let unauthenticated = "beyond loopback, with no service token: anyone who reaches it could \
                           call every RPC. Set CLAWGATE_SERVICE_TOKEN";
    let store_refusal = format!("the session store listens on {ANY}, {unauthenticated}");
    let coordinator_refusal = format!("the run coordinator listens on {ANY}, {unauthenticated}");
    let edge_args = ["--auth-mode", "token", "--token", GOOD];
    for case in [
        case("session-store", &[], &[], store_refusal),
        case(
            "run-coordinator",
            &["--store-address", "http://127.0.0.1:9"],
            &[],
            coordinator_refusal,
        ),
        case(
            "gateway-edge",
            &["--auth-mode", "none"],
            &[],
            "auth mode `none` on 0.0.0.0:0, beyond loopback, lets anyone who reaches it in",
        ),
        case(
            "gateway-edge",
            &[
                &edge_args[..],
                &["--store-address", "http://session-store:50061"],
            ]
            .concat(),
            &[],
            "the edge listens on 0.0.0.0:0, beyond loopback, and calls \
             http://session-store:50061 with no service token",
        ),
        // `CLAWGATE_INSECURE=false` is not a yes.
        case(
            "session-store",
            &[],
            &[("CLAWGATE_INSECURE", "false")],
            "--insecure",
        ),
    ] {
        assert_refused_on(ANY, case, data.path()).await;
    }
}

/// The cases above start when told `--insecure` (flag or variable), or
/// given a service token; an edge beyond loopback whose services are on
/// loopback needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_beyond_loopback_starts_with_a_token_or_when_told_insecure() {
    let data = tempfile::tempdir().unwrap();
    let token = [("CLAWGATE_SERVICE_TOKEN", GOOD)];
    let insecure = [("CLAWGATE_INSECURE", "true")];
    // Each coordinator calls a store with its own rule: one with the
    // token, one told --insecure.
    let guarded = start(case("session-store", &[], &token, ""), data.path()).await;
    let open = start(case("session-store", &["--insecure"], &[], ""), data.path()).await;
    let store_of = |store: &Process| format!("http://127.0.0.1:{}", store.address.port());
    let (guarded_url, open_url) = (store_of(&guarded), store_of(&open));
    for case in [
        case(
            "run-coordinator",
            &["--store-address", &guarded_url],
            &token,
            "",
        ),
        case(
            "run-coordinator",
            &["--store-address", &open_url],
            &insecure,
            "",
        ),
        case(
            "gateway-edge",
            &["--auth-mode", "none", "--insecure"],
            &[],
            "",
        ),
        case("gateway-edge", &["--token", GOOD], &[], ""),
        case(
            "gateway-edge",
            &[
                "--token",
                GOOD,
                "--store-address",
                "http://session-store:50061",
            ],
            &token,
            "",
        ),
    ] {
        drop(start(case, data.path()).await);
    }
}

/// Starts `case` beyond loopback and waits for its ready line.
async fn start(case: Case, data: &std::path::Path) -> Process {
    let role = match case.binary {
        "session-store" => Role::Store,
        "run-coordinator" => Role::Coordinator,
        _ => Role::Edge,
    };
    // Each store its own file: a started one holds its lock.
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let data = data.join(STARTED.fetch_add(1, Ordering::Relaxed).to_string());
    std::fs::create_dir_all(&data).unwrap();
    Process::start(
        command(&case, ANY, &data),
        case.binary,
        role.ready_message(),
    )
    .await
}

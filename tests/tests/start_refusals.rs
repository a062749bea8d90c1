//! A service refuses to start on settings that would leave it open, and
//! says why, naming the setting and never the secret: a shared secret (the
//! edge's token, password or device-token secret, a service token) shorter
//! than 16 bytes. Each case is the real binary, which must exit non-zero
//! before it serves.

use clawgate_system_tests::process::{binary_path, refused_start, service_command};

/// 12 bytes: under the 16 a shared secret needs.
const SHORT: &str = "short-secret";
/// Long enough.
const GOOD: &str = "a-good-long-shared-secret";

struct Case {
    binary: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// What the refusal must say.
    says: &'static str,
}

/// `binary` on loopback port 0 with `args` and `env`; everything else it
/// needs to start is given, so that only the case's setting stops it.
fn case(
    binary: &'static str,
    args: &[&str],
    env: &[(&'static str, &str)],
    says: &'static str,
) -> Case {
    Case {
        binary,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        says,
    }
}

async fn assert_refused(case: Case, data: &std::path::Path) {
    let mut command = service_command(binary_path(case.binary));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(&case.args);
    if case.binary == "session-store" {
        command.args(["--store", &data.join("store.redb").to_string_lossy()]);
    }
    for (key, value) in &case.env {
        command.env(key, value);
    }
    let (status, output) = refused_start(command).await;
    assert!(
        !status.success(),
        "{} {:?} started:\n{output}",
        case.binary,
        case.args
    );
    assert!(
        output.contains(case.says),
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
    ] {
        assert_refused(case, data.path()).await;
    }
}

//! The process spawner on a stand-in service: `sh` printing a ready line
//! like a service's, then sleeping until a signal ends it.

use std::time::Duration;

use clawgate_common::process::{Process, service_command};

/// A "service" that writes a line on stderr, announces `address` on
/// stdout, and waits; `exec` makes the signals reach `sleep` itself. The
/// stderr line comes first: once the address is announced it is in the
/// pipe, so a SIGTERM sent at once cannot beat it.
fn stand_in(address: &str) -> tokio::process::Command {
    let mut command = service_command("sh");
    command.args([
        "-c",
        &format!("echo oops >&2; echo 'INFO demo: serving address={address}'; exec sleep 600"),
    ]);
    command
}

#[tokio::test]
async fn reads_the_address_keeps_the_output_and_stops_on_sigterm() {
    let mut process = Process::start(stand_in("127.0.0.1:4242"), "demo", "serving")
        .await
        .unwrap();
    assert_eq!(process.address, "127.0.0.1:4242".parse().unwrap());
    assert_eq!(process.url(), "http://127.0.0.1:4242");
    assert!(process.pid().is_some());
    assert_eq!(
        process.logged_address("serving"),
        Some("127.0.0.1:4242".parse().unwrap())
    );
    assert!(!process.exited());
    let status = process.stop().await.unwrap();
    assert!(!status.success(), "ended by SIGTERM: {status:?}");
    let output = process.output();
    assert!(output.contains(&"stderr| oops".to_owned()), "{output:?}");
    assert!(
        output
            .iter()
            .any(|l| l == "INFO demo: serving address=127.0.0.1:4242"),
        "{output:?}"
    );
}

#[tokio::test]
async fn a_process_that_exits_before_announcing_fails_with_its_output() {
    let mut command = service_command("sh");
    command.args(["-c", "echo 'cannot bind' >&2; exit 3"]);
    let failed = Process::start(command, "demo", "serving").await;
    let message = failed.err().expect("no address announced").to_string();
    assert!(
        message.contains("demo exited before announcing its address"),
        "{message}"
    );
    assert!(message.contains("stderr| cannot bind"), "{message}");
}

#[tokio::test]
async fn keeps_only_the_last_lines_when_asked_and_is_killed() {
    let mut command = service_command("sh");
    command.args([
        "-c",
        "echo one; echo two; echo 'ready address=127.0.0.1:1'; exec sleep 600",
    ]);
    let mut process = Process::start_keeping(command, "demo", "ready", Some(2))
        .await
        .unwrap();
    assert_eq!(process.output(), ["two", "ready address=127.0.0.1:1"]);
    process.signal("STOP").unwrap();
    process.signal("CONT").unwrap();
    let status = process.kill().await.unwrap();
    assert!(!status.success());
    assert!(process.exited());
    assert_eq!(
        process.wait_exit(Duration::from_secs(5)).await,
        Some(status)
    );
}

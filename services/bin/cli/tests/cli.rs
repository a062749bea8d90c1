//! The built `clawgate-cli` binary against the whole system in this test
//! process: a session store (embedded file), a run coordinator with the echo
//! runtime, and a gateway edge, all on port 0.

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clawgate_system_tests::Sandbox;
use clawgate_system_tests::client::TOKEN;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

/// The longest any single CLI invocation may take in these tests.
const DEADLINE: Duration = Duration::from_secs(60);

/// Store + coordinator + edge in this process; they serve as long as the
/// system lives.
struct System {
    sandbox: Sandbox,
}

impl System {
    async fn start(echo: EchoConfig) -> Self {
        let sandbox = Sandbox::builder()
            .runtime(Arc::new(EchoRuntime::new(echo)))
            .edges(1)
            .start()
            .await;
        Self { sandbox }
    }

    async fn fast() -> Self {
        Self::start(EchoConfig::default()).await
    }

    /// The CLI aimed at this system with the right token.
    fn cli(&self, args: &[&str]) -> Command {
        command(self.sandbox.edge_url(), TOKEN, args)
    }
}

fn command(url: &str, token: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawgate-cli"));
    command
        .env_remove("CLAWGATE_URL")
        .env_remove("CLAWGATE_TOKEN")
        .env_remove("CLAWGATE_PASSWORD")
        .args(["--url", url, "--token", token])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs to completion within the deadline.
async fn run(mut command: Command) -> Output {
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .expect("the CLI finished within the deadline")
        .expect("the CLI runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_prints_the_echoed_reply_and_exits_0() {
    let system = System::fast().await;
    let output = run(system.cli(&["send", "hello from the cli", "--key", "t-send"])).await;
    assert_exit(&output, 0);
    assert_eq!(stdout(&output), "hello from the cli\n");
    assert!(
        stderr(&output).contains("run t-send: ok"),
        "{}",
        stderr(&output)
    );

    // The same key again: the run is over, nothing new starts.
    let again = run(system.cli(&["send", "hello from the cli", "--key", "t-send"])).await;
    assert_exit(&again, 0);
    assert!(stderr(&again).contains("already finished"));

    // agent.wait on the finished run.
    let waited = run(system.cli(&["wait", "t-send"])).await;
    assert_exit(&waited, 0);
    assert_eq!(stdout(&waited), "run t-send: ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_is_json_lines() {
    let system = System::fast().await;
    let message = "machine readable please";
    let output = run(system.cli(&["--json", "send", message, "--key", "t-json"])).await;
    assert_exit(&output, 0);
    let lines = json_lines(&output);
    assert_eq!(lines[0]["type"], "ack", "{lines:?}");
    assert_eq!(lines[0]["runId"], "t-json");
    assert_eq!(lines[0]["status"], "started");
    let deltas: String = lines
        .iter()
        .filter(|l| l["type"] == "delta")
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, message);
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "final", "{lines:?}");
    assert_eq!(last["state"], "final");
    assert_eq!(last["text"], message);
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "lifecycle" && l["data"]["phase"] == "start")
    );

    let listed = run(system.cli(&["--json", "sessions", "--limit", "10"])).await;
    assert_exit(&listed, 0);
    let lines = json_lines(&listed);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0]["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["key"] == "agent:main:main"),
        "{lines:?}"
    );

    // Errors are JSON lines too.
    let failed = run(system.cli(&["--json", "wait", "never-ran", "--timeout-ms", "10"])).await;
    assert_exit(&failed, 8);
    let lines = json_lines(&failed);
    assert_eq!(lines[0]["status"], "timeout");
    assert_eq!(lines[1]["type"], "error");
    assert_eq!(lines[1]["exitCode"], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_exits_4_with_the_servers_reason() {
    let system = System::fast().await;
    let output = run(command(
        system.sandbox.edge_url(),
        "wrong-token",
        &["sessions"],
    ))
    .await;
    assert_exit(&output, 4);
    let err = stderr(&output);
    assert!(err.contains("unauthorized"), "{err}");
    assert!(err.contains("AUTH_TOKEN_MISMATCH"), "{err}");

    let output = run(command(
        system.sandbox.edge_url(),
        "wrong-token",
        &["--json", "sessions"],
    ))
    .await;
    assert_exit(&output, 4);
    let lines = json_lines(&output);
    assert_eq!(lines[0]["type"], "error");
    assert_eq!(lines[0]["exitCode"], 4);
    assert_eq!(lines[0]["code"], "INVALID_REQUEST");
    assert_eq!(lines[0]["details"]["code"], "AUTH_TOKEN_MISMATCH");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_on_an_unknown_run_times_out_with_8() {
    let system = System::fast().await;
    let output = run(system.cli(&["wait", "no-such-run", "--timeout-ms", "100"])).await;
    assert_exit(&output, 8);
    assert!(stderr(&output).contains("has not finished"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_the_user_and_assistant_turns() {
    let system = System::fast().await;
    let sent = run(system.cli(&["send", "remember me", "--session", "agent:main:hist"])).await;
    assert_exit(&sent, 0);
    let output = run(system.cli(&["history", "agent:main:hist"])).await;
    assert_exit(&output, 0);
    assert_eq!(
        stdout(&output),
        "user: remember me\nassistant: remember me\n"
    );

    let limited = run(system.cli(&["history", "agent:main:hist", "--limit", "1"])).await;
    assert_exit(&limited, 0);
    assert_eq!(stdout(&limited), "assistant: remember me\n");

    let listed = run(system.cli(&["sessions"])).await;
    assert_exit(&listed, 0);
    assert!(
        stdout(&listed).contains("agent:main:hist"),
        "{}",
        stdout(&listed)
    );
}

/// Reads the child's stdout lines until one is a `delta` for the run.
async fn until_first_delta(child: &mut Child) -> Vec<String> {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let value: Value = serde_json::from_str(&line).unwrap();
            seen.push(line);
            if value["type"] == "delta" {
                return true;
            }
        }
        false
    })
    .await
    .expect("a delta within the deadline");
    assert!(found, "the stream ended without a delta: {seen:?}");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_a_slow_run_and_its_send_exits_6() {
    // 100 pieces 50 ms apart: about 5 s unless aborted.
    let system = System::start(EchoConfig {
        chunks: 100,
        pace: Duration::from_millis(50),
    })
    .await;
    let message = "a slow message that streams back in one hundred small pieces, \
                   unless somebody aborts it first";
    let mut send = system.cli(&["--json", "send", message, "--key", "t-slow"]);
    send.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = send.spawn().unwrap();
    let before = until_first_delta(&mut child).await;

    let aborted = run(system.cli(&["abort", "main", "--run", "t-slow"])).await;
    assert_exit(&aborted, 0);
    assert_eq!(stdout(&aborted), "aborted: t-slow\n");

    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("send ends after the abort")
        .unwrap();
    assert_exit(&output, 6);
    let lines = json_lines(&output);
    let last_event = &lines[lines.len() - 2];
    assert_eq!(last_event["type"], "final", "{before:?} {lines:?}");
    assert_eq!(last_event["state"], "aborted");
    assert_eq!(last_event["stopReason"], "rpc");
    let partial = last_event["text"].as_str().unwrap();
    assert!(message.starts_with(partial) && partial.len() < message.len());
    assert_eq!(lines.last().unwrap()["exitCode"], 6);

    // Nothing left to abort; waiting reports the abort.
    let again = run(system.cli(&["abort", "main"])).await;
    assert_exit(&again, 0);
    assert_eq!(stdout(&again), "nothing to abort\n");
    let waited = run(system.cli(&["wait", "t-slow"])).await;
    assert_exit(&waited, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_connection_errors() {
    // Nobody listens on a port that was just released.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    drop(listener);
    let output = run(command(&url, TOKEN, &["sessions"])).await;
    assert_exit(&output, 3);
    assert!(
        stderr(&output).contains("cannot connect"),
        "{}",
        stderr(&output)
    );

    let output = run(command(&url, TOKEN, &[])).await;
    assert_exit(&output, 2);
    let output = run(command("http://nope", TOKEN, &["sessions"])).await;
    assert_exit(&output, 2);

    let help = run(command(&url, TOKEN, &["--help"])).await;
    assert_exit(&help, 0);
    assert!(stdout(&help).contains("8  waiting for the run gave up"));
}

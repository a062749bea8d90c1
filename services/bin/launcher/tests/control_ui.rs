//! The browser Control UI of the real `openclaw` npm package, served by the
//! all-in-one `clawgate` (`--control-ui-dir`) and driven in Debian's
//! Chromium by `tests/browser/control_ui.mjs` (Playwright over the system
//! browser): it connects, loads the history, sends a message and sees the
//! reply stream in, reloads and sees both turns, stops a slow run with the
//! Stop button, and switches to a new session and back — with no `res`
//! answered `ok:false` on the way.
//!
//! What it needs is fetched into a cache that git ignores
//! (`tests/browser/fetch.sh`, which `.ci/run` runs too): the driver's npm
//! package and the Control UI files. Chromium comes from the system
//! (`CHROMIUM`, default `/usr/bin/chromium`; `.ci/run` installs Debian's).
//! Nothing here is skipped: a missing piece fails the test. The screenshots
//! and the frames the page exchanged are kept in
//! `target/tmp/control-ui-artifacts/`.
//!
//! A second test opens every route of the Control UI's route table, as a
//! click does, on one connection (`tests/browser/control_ui_pages.mjs`)
//! against an all-in-one whose runs
//! go through an OpenAI-compatible stub that reports token usage, after a
//! restart: each page clean, the Usage page showing the tokens the stub
//! reported before the restart; a screenshot of each page in
//! `target/tmp/control-ui-pages/`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clawgate_system_tests::client::Client;
use clawgate_system_tests::openai_stub::OpenAiStub;
use clawgate_system_tests::process::Process;
use clawgate_system_tests::report;
use serde_json::json;
use tokio::process::Command;

const TOKEN: &str = "control-ui-token";
/// The whole browser flow, on a slow machine.
const FLOW_TIMEOUT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// The cache with the driver's packages and the Control UI files, filled
/// if it is not yet; returns it and the Control UI directory.
fn fetched() -> (PathBuf, PathBuf) {
    let cache = std::env::var_os("CLAWGATE_BROWSER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser-cache"));
    let out = std::process::Command::new("bash")
        .arg(repo().join("tests/browser/fetch.sh"))
        .arg(&cache)
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs tests/browser/fetch.sh");
    assert!(
        out.status.success(),
        "tests/browser/fetch.sh could not fetch the driver and the Control UI into {} \
         (it needs npm and the npm registry)",
        cache.display()
    );
    let ui = String::from_utf8(out.stdout).expect("a path");
    let ui = PathBuf::from(ui.lines().last().expect("the Control UI directory").trim());
    assert!(
        ui.join("index.html").is_file(),
        "no index.html in {}",
        ui.display()
    );
    (cache, ui)
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.is_file(),
        "no Chromium at {} (install Debian's: apt-get install chromium; .ci/run does)",
        path.display()
    );
    path
}

async fn start_all_in_one(data: &Path, control_ui: &Path) -> Process {
    let mut command = common::all_in_one(data, TOKEN);
    command
        .arg("--control-ui-dir")
        .arg(control_ui)
        // Replies stream for a few seconds, so the page shows them
        // streaming and its Stop button has a run to stop.
        .args(["--coordinator-echo-chunks", "30"])
        .args(["--coordinator-echo-pace", "400ms"]);
    common::start(command).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_ui_connects_chats_stops_and_switches_sessions() {
    let (cache, control_ui) = fetched();
    let chromium = chromium();
    let data = tempfile::tempdir().unwrap();
    let clawgate = start_all_in_one(data.path(), &control_ui).await;
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("control-ui-artifacts");
    let _ = std::fs::remove_dir_all(&artifacts);

    let page = format!("http://{}/#token={TOKEN}", clawgate.address);
    let (passed, printed) = drive(
        "control_ui.mjs",
        &[page.as_ref(), artifacts.as_os_str()],
        &[
            ("CLAWGATE_BROWSER_CACHE", cache.as_os_str()),
            ("CHROMIUM", chromium.as_os_str()),
        ],
    )
    .await;
    report(&format!(
        "control UI flow (artifacts in {}):\n{printed}",
        artifacts.display()
    ));
    assert!(
        passed,
        "the Control UI flow failed:\n{printed}\n\nclawgate's log:\n{}",
        clawgate.output().join("\n")
    );
    assert!(printed.contains("RESULT: PASS"), "{printed}");
    assert!(printed.contains("ok:false answers: 0"), "{printed}");
    for shot in [
        "01-mid-stream.png",
        "03-after-reload.png",
        "04-after-stop.png",
    ] {
        assert!(artifacts.join(shot).is_file(), "no screenshot {shot}");
    }
}

/// Runs `driver` (a script of `tests/browser/`) with `args` in node, within
/// the flow's deadline; returns whether it passed and what it printed.
async fn drive(
    script: &str,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> (bool, String) {
    let mut command = Command::new("node");
    command
        .arg(repo().join("tests/browser").join(script))
        .args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(FLOW_TIMEOUT, out)
        .await
        .expect("the browser flow finishes")
        .expect("node runs the driver");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// The all-in-one on `data`, its runs answered by the OpenAI-compatible
/// `stub`.
async fn start_on_openai(data: &Path, control_ui: &Path, stub: &OpenAiStub) -> Process {
    let mut command = common::all_in_one(data, TOKEN);
    command
        .arg("--control-ui-dir")
        .arg(control_ui)
        .args(["--coordinator-runtime", "openai"])
        .args(["--coordinator-openai-base-url", &stub.base_url])
        .args(["--coordinator-openai-model", "stub-model"])
        .env("OPENAI_API_KEY", "sk-stub-key");
    common::start(command).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_the_control_ui_is_clean_and_usage_survives_a_restart() {
    let (cache, control_ui) = fetched();
    let chromium = chromium();
    let data = tempfile::tempdir().unwrap();
    let stub = OpenAiStub::start().await;
    let mut clawgate = start_on_openai(data.path(), &control_ui, &stub).await;
    let url = format!("ws://{}", clawgate.address);
    let mut client = Client::connect_with_token(&url, TOKEN, &["operator.admin"]).await;
    for (n, message) in ["how many tokens", "and now", "one more question"]
        .iter()
        .enumerate()
    {
        let run = format!("usage-run-{n}");
        let key = if n == 2 { "usage-other" } else { "main" };
        let sent = client
            .request(
                "chat.send",
                json!({"sessionKey": key, "message": message, "idempotencyKey": run}),
            )
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
        let waited = client
            .request("agent.wait", json!({"runId": run, "timeoutMs": 60_000}))
            .await;
        assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    }
    let (prompt, completion) = stub.reported();
    assert!(prompt > 0 && completion > 0, "the stub reported no usage");
    let expected = prompt + completion;
    drop(client);

    // The figures are in the store: a restart on the same data keeps them.
    clawgate.signal("TERM");
    clawgate.wait_exit(Duration::from_secs(30)).await;
    let clawgate = start_on_openai(data.path(), &control_ui, &stub).await;
    let url = format!("ws://{}", clawgate.address);
    let mut client = Client::connect_with_token(&url, TOKEN, &["operator.read"]).await;
    let usage = client
        .request("sessions.usage", json!({"agentScope": "all"}))
        .await;
    let totals = &usage["payload"]["totals"];
    assert_eq!(
        (&totals["input"], &totals["output"], &totals["totalTokens"]),
        (&json!(prompt), &json!(completion), &json!(expected)),
        "{usage}"
    );
    assert_eq!(
        usage["payload"]["sessions"].as_array().map(Vec::len),
        Some(2)
    );
    drop(client);

    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("control-ui-pages");
    let _ = std::fs::remove_dir_all(&artifacts);
    let base = format!("http://{}", clawgate.address);
    let expected = expected.to_string();
    let (passed, printed) = drive(
        "control_ui_pages.mjs",
        &[base.as_ref(), TOKEN.as_ref(), artifacts.as_os_str()],
        &[
            ("CLAWGATE_BROWSER_CACHE", cache.as_os_str()),
            ("CHROMIUM", chromium.as_os_str()),
            ("CONTROL_UI_DIR", control_ui.as_os_str()),
            ("EXPECT_USAGE_TOKENS", expected.as_ref()),
        ],
    )
    .await;
    report(&format!(
        "control UI pages (screenshots in {}):\n{printed}",
        artifacts.display()
    ));
    assert!(
        passed && printed.contains("RESULT: PASS"),
        "a page of the Control UI is not clean:\n{printed}\n\nclawgate's log:\n{}",
        clawgate.output().join("\n")
    );
    let routes: usize = printed
        .lines()
        .find_map(|l| l.strip_prefix("routes: "))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("the driver counts the routes");
    assert!(routes >= 40, "only {routes} routes visited:\n{printed}");
    let shots = std::fs::read_dir(&artifacts)
        .expect("the screenshots")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    assert_eq!(shots, routes, "one screenshot per route");
    for page in ["_usage", "_debug", "_settings_general", "_logs"] {
        assert!(
            printed.contains(&format!("clean {}", page.replace('_', "/"))),
            "{page} not visited clean:\n{printed}"
        );
    }
}

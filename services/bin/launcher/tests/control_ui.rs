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

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clawgate_system_tests::process::Process;
use clawgate_system_tests::report;
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
    let driver = Command::new("node")
        .arg(repo().join("tests/browser/control_ui.mjs"))
        .arg(&page)
        .arg(&artifacts)
        .env("CLAWGATE_BROWSER_CACHE", &cache)
        .env("CHROMIUM", &chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(FLOW_TIMEOUT, driver)
        .await
        .expect("the browser flow finishes")
        .expect("node runs the driver");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    report(&format!(
        "control UI flow (artifacts in {}):\n{printed}",
        artifacts.display()
    ));
    assert!(
        out.status.success(),
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

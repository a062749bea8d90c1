//! What the launcher's tests share: the all-in-one `clawgate` on port 0,
//! started through the test kit's process (a clean environment, the
//! address read from its log, its output kept).
// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::Path;

use clawgate_system_tests::process::{Process, service_command, until_ready};
use tokio::process::Command;

/// `clawgate` serving everything on port 0 (its data in `data`), with
/// `token` for the edge; more flags and variables may follow.
pub fn all_in_one(data: &Path, token: &str) -> Command {
    with_settings(service_command(env!("CARGO_BIN_EXE_clawgate")), data, token)
}

/// [`all_in_one`] with its limit on open files (`RLIMIT_NOFILE`, soft and
/// hard) set to `open_files` before it starts, through `prlimit(1)`
/// (util-linux), which execs it: the process, its pid and its output are
/// `clawgate`'s.
pub fn all_in_one_with_open_files(data: &Path, token: &str, open_files: u64) -> Command {
    let mut command = service_command("prlimit");
    command
        .arg(format!("--nofile={open_files}:{open_files}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_clawgate"));
    with_settings(command, data, token)
}

fn with_settings(mut command: Command, data: &Path, token: &str) -> Command {
    let any_port = "127.0.0.1:0";
    command
        .args(["--store", &data.join("store.redb").to_string_lossy()])
        .args(["--store-listen", any_port, "--coordinator-listen", any_port])
        .args(["--edge-listen", any_port, "--edge-token", token])
        .args(["--store-metrics-listen", any_port])
        .args(["--coordinator-metrics-listen", any_port])
        .args(["--edge-metrics-listen", any_port]);
    command
}

/// Starts `command` (an all-in-one) and returns once its edge is ready.
pub async fn start(command: Command) -> Process {
    let clawgate = Process::start(command, "clawgate", "gateway edge listening").await;
    until_ready(clawgate.address, || clawgate.output_text()).await;
    clawgate
}

//! What the launcher's tests share: the all-in-one `clawgate` on port 0.

use std::path::Path;

use tokio::process::Command;

/// `clawgate` serving everything on port 0 (its data in `data`), with
/// `token` for the edge and logs as tests read them.
pub fn all_in_one(data: &Path, token: &str) -> Command {
    let any_port = "127.0.0.1:0";
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawgate"));
    command
        .args(["--store", &data.join("store.redb").to_string_lossy()])
        .args(["--store-listen", any_port, "--coordinator-listen", any_port])
        .args(["--edge-listen", any_port, "--edge-token", token])
        .args(["--store-metrics-listen", any_port])
        .args(["--coordinator-metrics-listen", any_port])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("LOG_FORMAT");
    command
}

//! Service binaries as child processes, for whoever starts them (the
//! system tests and the load generator): a command with a clean
//! environment ([`service_command`]); the running [`Process`], its listen
//! address read from its log, its output kept for failure messages,
//! stopped with SIGTERM (SIGKILL after a deadline, and on drop); and what
//! `/proc` says about a process ([`procfs`]).

use std::ffi::OsString;
use std::path::Path;

use tokio::process::Command;

mod child;
mod log;
pub mod procfs;

pub use child::{Process, ProcessError, START_TIMEOUT, STOP_TIMEOUT};
pub use log::address_field;

/// Variable prefixes not inherited: a developer's shell settings (a store
/// URL, an OTLP endpoint, a log filter) must not change what a started
/// service does. Callers set what they need.
const SCRUBBED_PREFIXES: &[&str] = &[
    "SESSION_STORE_",
    "COORDINATOR_",
    "EDGE_",
    "OTEL_",
    "OPENAI_",
    "RUST_LOG",
    "LOG_FORMAT",
];

/// A command for the service binary at `path`: none of the caller's
/// service, OTLP or log settings, no colours, `info` logs (the lines that
/// announce the addresses are `info` lines).
pub fn service_command(path: impl AsRef<Path>) -> Command {
    let mut command = Command::new(path.as_ref());
    for (key, _) in std::env::vars_os() {
        if is_scrubbed(&key) {
            command.env_remove(key);
        }
    }
    command.env("NO_COLOR", "1").env("RUST_LOG", "info");
    command
}

fn is_scrubbed(key: &OsString) -> bool {
    key.to_str()
        .is_some_and(|k| SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p)))
}

//! A service binary as a child process, the way tests start one: the one
//! implementation the load generator shares
//! ([`clawgate_common::process::Process`]: a clean environment, the
//! address read from the log, the output kept, real signals), with the
//! tests' rules on top: the binaries are the ones cargo built next to the
//! test executable, a failure panics with the process's output, and no
//! test binds a fixed port.
//!
//! That last rule is enforced: while a test binary runs processes it holds
//! the all-in-one's default ports itself ([`DEFAULT_PORTS`]), so a child
//! that would listen on one of them fails at once, exactly as it would
//! next to a running `clawgate`.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::OnceLock;
use std::time::Duration;

use clawgate_telemetry::metrics::http_request;
use tokio::process::Command;

pub use clawgate_common::process::{START_TIMEOUT, address_field, service_command};

use crate::wait::poll;

/// The ports the services listen on by default (the all-in-one's, see the
/// README): store gRPC and metrics, coordinator gRPC and metrics, the edge
/// and its metrics.
/// `services/bin/launcher/tests/config.rs` checks this list against the binaries'
/// own defaults.
pub const DEFAULT_PORTS: [u16; 6] = [50061, 9461, 50062, 9462, 18789, 9463];

/// Takes every free default port on 127.0.0.1 for the rest of this test
/// binary's life (a port already taken, by a running `clawgate` say, is
/// taken either way).
fn hold_default_ports() {
    static HELD: OnceLock<Vec<std::net::TcpListener>> = OnceLock::new();
    HELD.get_or_init(|| {
        DEFAULT_PORTS
            .iter()
            .filter_map(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).ok())
            .collect()
    });
}

/// Where cargo put binary `name`: the test executable lives in
/// `target/<profile>/deps/`, the workspace's binaries in `target/<profile>/`.
/// `cargo test --workspace --all-targets` builds a package's binary only
/// for a package with integration tests of its own (as the three services
/// have); a test of another binary belongs in that binary's package, with
/// `CARGO_BIN_EXE_<name>`.
pub fn binary_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().expect("the test executable's directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "binary `{name}` not found at {}: run `cargo build --bins` first \
         (`cargo test --workspace --all-targets` builds it too)",
        path.display()
    );
    path
}

/// A running service process; killed when dropped. Everything the shared
/// process offers is here too (its `name`, `address`, `output()`, …).
pub struct Process(clawgate_common::process::Process);

impl Deref for Process {
    type Target = clawgate_common::process::Process;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Process {
    /// Starts `command` and returns once it logged `ready` with an
    /// `address` field, or panics with its output. The default ports are
    /// held meanwhile (see the module's comment).
    pub async fn start(command: Command, name: &str, ready: &'static str) -> Process {
        hold_default_ports();
        match clawgate_common::process::Process::start(command, name, ready).await {
            Ok(process) => Process(process),
            Err(e) => panic!("{e}"),
        }
    }

    /// Sends SIGKILL and waits for the process to be gone.
    pub async fn kill(&mut self) {
        self.0.kill().await.expect("the killed process is reaped");
    }

    /// Sends a real signal (`STOP`, `CONT`, `TERM`, …).
    pub fn signal(&self, signal: &str) {
        self.0.signal(signal).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits for the process to exit by itself, and for its last output;
    /// panics with its output after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.0.wait_exit(timeout).await {
            Some(status) => status,
            None => panic!(
                "{} did not exit within {timeout:?}:\n{}",
                self.name,
                self.output_text()
            ),
        }
    }
}

/// Runs `command`, which must refuse to start: returns its exit status
/// and its output (stdout, then stderr) once it exited; panics if it is
/// still running after [`START_TIMEOUT`] (it started instead of refusing).
pub async fn refused_start(mut command: Command) -> (ExitStatus, String) {
    hold_default_ports();
    command
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(START_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{command:?} still runs after {START_TIMEOUT:?}: it started"))
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, text)
}

/// Waits until `address`'s `/readyz` answers 200; panics after
/// [`START_TIMEOUT`] with `output()`.
pub async fn until_ready(address: SocketAddr, output: impl Fn() -> String) {
    let ready = poll(
        format!("{address}/readyz to answer 200"),
        START_TIMEOUT,
        async || http_ok(address, "/readyz").await,
    )
    .await;
    if let Err(timed_out) = ready {
        panic!("{timed_out}:\n{}", output());
    }
}

/// Whether `GET path` answers 200 within 5 s.
pub async fn http_ok(address: SocketAddr, path: &str) -> bool {
    let exchange = http_request(address, "GET", path);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), exchange).await,
        Ok(Ok(reply)) if reply.status == 200
    )
}

/// When a service logged its first line containing `needle`: the line's
/// leading timestamp (the services log RFC 3339 UTC, e.g.
/// `2026-12-05T12:21:02.546807Z`) as milliseconds since the Unix epoch, the
/// scale of the store's clock. Lets a test time an event by the process's
/// own record of it instead of by when a poll happened to notice it.
pub fn logged_at_ms(output: &str, needle: &str) -> Option<i64> {
    let line = output.lines().find(|line| line.contains(needle))?;
    rfc3339_utc_ms(line.split_whitespace().next()?)
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` as milliseconds since the epoch.
fn rfc3339_utc_ms(stamp: &str) -> Option<i64> {
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut hms = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (hms.next()??, hms.next()??, hms.next()??);
    let millis: i64 = format!("{fraction:0<3}")[..3].parse().ok()?;
    // Days since 1970-01-01 in the proleptic Gregorian calendar, with
    // March as the first month so that the leap day ends the year.
    let shifted = if month <= 2 { year - 1 } else { year };
    let era = shifted.div_euclid(400);
    let year_of_era = shifted - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_stamp_reads_as_epoch_milliseconds() {
        assert_eq!(rfc3339_utc_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_utc_ms("2000-03-01T00:00:00.5Z"),
            Some(951_868_800_500)
        );
        assert_eq!(
            rfc3339_utc_ms("2026-12-05T12:21:02.546807Z"),
            Some(1_796_473_262_546)
        );
        assert_eq!(rfc3339_utc_ms("not a stamp"), None);
        let output =
            "2024-02-29T23:59:59.999Z  INFO started\n2024-03-01T00:00:00.001Z ERROR ownership lost";
        assert_eq!(
            logged_at_ms(output, "ownership lost"),
            Some(1_709_251_200_001)
        );
    }
}

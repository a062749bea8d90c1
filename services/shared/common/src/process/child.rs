//! A running service process: its address read from its log, its output
//! kept, stopped with a real signal.

use std::fmt;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::log::{Lines, address_field, collect};
use super::procfs;

/// How long a process may take to announce its address (a cold start on a
/// busy machine included).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Makes the child die with the thread that starts it (Linux's parent-death
/// signal), so that a parent killed or ending without dropping its
/// [`Process`] (a test process killed by a timeout, say) leaves no service
/// running behind it, holding ports and CPU. Started from a test's thread
/// or a runtime's worker, the child lives as long as its parent's test or
/// runtime.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs in the forked child before exec and only
    // makes one async-signal-safe system call.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Why a process did not start, or did not stop as asked; the message
/// holds its output.
#[derive(Debug, Clone)]
pub struct ProcessError(String);

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProcessError {}

/// A running service process; SIGKILLed when dropped.
pub struct Process {
    /// The binary's name, for messages.
    pub name: String,
    /// Where it listens, as its ready line announced.
    pub address: SocketAddr,
    child: Child,
    output: Arc<Mutex<Lines>>,
    /// The tasks reading its stdout and stderr.
    collectors: Vec<JoinHandle<()>>,
}

impl Process {
    /// Starts `command` (stdin closed, output piped and kept, killed on
    /// drop) and returns once it logged `ready` with an `address` field.
    /// Every line is kept.
    pub async fn start(
        command: Command,
        name: &str,
        ready: &'static str,
    ) -> Result<Self, ProcessError> {
        Self::start_keeping(command, name, ready, None).await
    }

    /// [`start`](Self::start), keeping only the last `last_lines` lines
    /// (`None`: all): a process that runs long under load.
    pub async fn start_keeping(
        mut command: Command,
        name: &str,
        ready: &'static str,
        last_lines: Option<usize>,
    ) -> Result<Self, ProcessError> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        die_with_parent(&mut command);
        let args: Vec<_> = command.as_std().get_args().map(|a| a.to_owned()).collect();
        let mut child = command
            .spawn()
            .map_err(|e| ProcessError(format!("cannot start {name}: {e}")))?;
        let output = Lines::new(last_lines);
        let (announce, announced) = oneshot::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let stdout_done =
            tokio::spawn(collect(stdout, output.clone(), "", Some((ready, announce))));
        let stderr_done = tokio::spawn(collect(stderr, output.clone(), "stderr| ", None));
        let mut process = Self {
            name: name.to_owned(),
            address: SocketAddr::from(([0, 0, 0, 0], 0)),
            child,
            output,
            collectors: vec![stdout_done, stderr_done],
        };
        match tokio::time::timeout(START_TIMEOUT, announced).await {
            Ok(Ok(address)) => {
                process.address = address;
                Ok(process)
            }
            // Stdout closed without the line: the process is exiting.
            Ok(Err(_)) => {
                let status = process.wait_exit(STOP_TIMEOUT).await;
                Err(ProcessError(format!(
                    "{name} exited before announcing its address ({status:?}), args {args:?}:\n{}",
                    process.output_text()
                )))
            }
            Err(_) => Err(ProcessError(format!(
                "{name} did not announce its address within {START_TIMEOUT:?}:\n{}",
                process.output_text()
            ))),
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `http://address`, how the other services are given it.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Sends SIGKILL and waits for the process to be gone.
    pub async fn kill(&mut self) -> std::io::Result<ExitStatus> {
        // A process that already exited cannot be signalled; it is reaped.
        let _ = self.child.start_kill();
        self.child.wait().await
    }

    /// Sends a real signal (`STOP`, `CONT`, `TERM`, …) with kill(1).
    pub fn signal(&self, signal: &str) -> Result<(), ProcessError> {
        let pid = self
            .pid()
            .ok_or_else(|| ProcessError(format!("{} is not running", self.name)))?;
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status();
        match sent {
            Ok(status) if status.success() => Ok(()),
            other => Err(ProcessError(format!(
                "kill -{signal} {} failed: {other:?}",
                self.name
            ))),
        }
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `timeout` for the process to exit by itself, and then
    /// for its last output; `None` if it still runs.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()?;
        for collector in self.collectors.drain(..) {
            let _ = tokio::time::timeout(timeout, collector).await;
        }
        status.ok()
    }

    /// SIGTERM, then SIGKILL if it has not exited within [`STOP_TIMEOUT`]
    /// (an error: it did not stop as asked).
    pub async fn stop(&mut self) -> Result<ExitStatus, ProcessError> {
        // One that already exited cannot be signalled: waiting reaps it.
        let _ = self.signal("TERM");
        if let Some(status) = self.wait_exit(STOP_TIMEOUT).await {
            return Ok(status);
        }
        let _ = self.kill().await;
        Err(ProcessError(format!(
            "{} did not exit within {STOP_TIMEOUT:?} of SIGTERM and was killed:\n{}",
            self.name,
            self.output_text()
        )))
    }

    /// CPU time the process used so far (user + system), from `/proc`.
    pub fn cpu_time(&self) -> Option<Duration> {
        let ticks = procfs::cpu_ticks(self.pid()?).ok()?;
        Some(procfs::CLOCK_TICK * u32::try_from(ticks).ok()?)
    }

    /// A memory figure of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`, …).
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        procfs::status_kib(self.pid()?, field).ok()
    }

    /// The `address` field of the first kept line that contains `message`
    /// (e.g. `serving /metrics`).
    pub fn logged_address(&self, message: &str) -> Option<SocketAddr> {
        self.output()
            .iter()
            .filter(|line| line.contains(message))
            .find_map(|line| address_field(line))
    }

    /// Every kept line, in order (stderr lines prefixed `stderr| `).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().all()
    }

    /// [`output`](Self::output) as one text, for a message.
    pub fn output_text(&self) -> String {
        self.output().join("\n")
    }
}

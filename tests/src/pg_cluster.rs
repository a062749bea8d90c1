//! A PostgreSQL cluster of a test's own: `initdb` into a temporary
//! directory, the server on a port of its own, started as a real process
//! the test can SIGKILL, restart on the same data, SIGSTOP and SIGCONT
//! (the postmaster and every backend), for the faults the shared local
//! PostgreSQL must never suffer. Settings and files (a certificate, say)
//! are the test's to give before it starts.
//!
//! The server binaries come from the machine's PostgreSQL installation
//! (`pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`); a
//! machine without them fails the test. PostgreSQL refuses to run as root,
//! so under root (CI) the cluster runs as the `postgres` user.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long the server may take to accept connections after a start.
const START_WITHIN: Duration = Duration::from_secs(60);

/// A cluster to start: settings for `postgresql.conf` and files for its
/// data directory.
#[derive(Default)]
pub struct PgClusterBuilder {
    settings: Vec<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
}

impl PgClusterBuilder {
    /// A `postgresql.conf` setting (`ssl`, `on`), given at every start.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// A file written into the data directory before the first start,
    /// readable by the server only (a key must be).
    pub fn file(mut self, name: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.to_owned(), contents.into()));
        self
    }

    /// Makes the cluster and starts the server.
    pub async fn start(self) -> PgCluster {
        let bin = server_bindir();
        let root = tempfile::tempdir().expect("a temporary directory");
        let owner = server_user();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        if let Some((uid, gid)) = owner {
            for path in [root.path(), &data] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
        }
        let mut initdb = as_server_user(Command::new(bin.join("initdb")), owner);
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null());
        let made = initdb.output().await.expect("initdb runs");
        assert!(
            made.status.success(),
            "initdb failed: {}\n{}",
            String::from_utf8_lossy(&made.stdout),
            String::from_utf8_lossy(&made.stderr)
        );
        for (name, contents) in &self.files {
            let path = data.join(name);
            std::fs::write(&path, contents).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
        }
        let mut cluster = PgCluster {
            bin,
            port: free_port(),
            owner,
            settings: self.settings,
            server: None,
            root,
        };
        cluster.start_server().await;
        cluster
    }
}

/// A running (or stopped) cluster; everything of it is killed and removed
/// when dropped.
pub struct PgCluster {
    bin: PathBuf,
    /// Where it listens, on 127.0.0.1.
    pub port: u16,
    owner: Option<(u32, u32)>,
    settings: Vec<(String, String)>,
    server: Option<Child>,
    root: tempfile::TempDir,
}

impl PgCluster {
    pub fn builder() -> PgClusterBuilder {
        PgClusterBuilder::default()
    }

    /// A cluster with the default settings, started.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The server's log so far, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("server.log")
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(Child::id)
    }

    /// SIGKILLs the postmaster and every backend at once (as an OOM kill
    /// of its container would), and waits until all are gone.
    pub async fn kill(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let pid = server.id().expect("a running server has a pid");
        let family = process_family(pid);
        for pid in &family {
            signal(*pid, "KILL");
        }
        let _ = server.wait().await;
        let deadline = Instant::now() + START_WITHIN;
        while family.iter().any(|pid| alive(*pid)) {
            assert!(Instant::now() < deadline, "backends outlived SIGKILL");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts the server again on the same data and port (after
    /// [`kill`](Self::kill)); it recovers from its WAL.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.start_server().await;
    }

    /// SIGSTOPs the postmaster and every backend: connections stay open
    /// and nothing answers.
    pub fn pause(&self) {
        self.signal_all("STOP");
    }

    /// SIGCONTs what [`pause`](Self::pause) stopped.
    pub fn resume(&self) {
        self.signal_all("CONT");
    }

    fn signal_all(&self, name: &str) {
        let pid = self.pid().expect("the server runs");
        for pid in process_family(pid) {
            signal(pid, name);
        }
    }

    async fn start_server(&mut self) {
        let log = std::fs::File::create(self.log_path()).unwrap();
        let mut command = as_server_user(Command::new(self.bin.join("postgres")), self.owner);
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.root.path().display()
            ));
        for (name, value) in &self.settings {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        self.server = Some(command.spawn().expect("postgres starts"));
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if self.accepts_connections().await {
                return;
            }
            let exited = self.server.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "PostgreSQL did not start ({exited:?}):\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn accepts_connections(&self) -> bool {
        let connected = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await;
        let Ok((client, connection)) = connected else {
            return false;
        };
        let connection = tokio::spawn(connection);
        let ready = client.simple_query("SELECT 1").await.is_ok();
        connection.abort();
        ready
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // SIGKILL ends a stopped process too; every backend goes.
            for pid in process_family(pid) {
                signal(pid, "KILL");
            }
        }
    }
}

/// The PostgreSQL server binaries of this machine.
fn server_bindir() -> PathBuf {
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").is_file() {
            return dir;
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dir| dir.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.retain(|bin| bin.join("initdb").is_file());
    versions.sort_by_key(|bin| {
        let version = bin.parent().and_then(Path::file_name);
        version.and_then(|v| v.to_str()?.parse::<u32>().ok())
    });
    versions.pop().expect(
        "PostgreSQL's server binaries (initdb, postgres) are not on this machine: \
         install the postgresql package",
    )
}

/// The `postgres` user's ids when this process is root (PostgreSQL
/// refuses to run as root); `None` runs the server as ourselves.
fn server_user() -> Option<(u32, u32)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let euid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    if euid != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id runs");
        assert!(
            out.status.success(),
            "no postgres user to run PostgreSQL as"
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    Some((id("-u"), id("-g")))
}

fn as_server_user(mut command: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    command
}

/// A port that was free a moment ago (PostgreSQL cannot be given port 0).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `pid` and every process descended from it, from `/proc`.
fn process_family(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's name in parentheses: state, then ppid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut family = vec![pid];
    let mut at = 0;
    while at < family.len() {
        let parent = family[at];
        family.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        at += 1;
    }
    family
}

fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status();
}

/// Whether `pid` still exists (a zombie does not count).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn count(url: &str) -> Result<i64, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let row = client.query_one("SELECT count(*) FROM kept", &[]).await?;
        Ok(row.get(0))
    }

    #[tokio::test]
    async fn keeps_its_data_through_a_kill_and_answers_nothing_while_paused() {
        let mut cluster = PgCluster::start().await;
        let (client, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1), (2)")
            .await
            .unwrap();
        assert!(process_family(cluster.pid().unwrap()).len() > 1, "backends");

        cluster.kill().await;
        assert!(count(&cluster.url()).await.is_err(), "down after the kill");
        cluster.restart().await;
        assert_eq!(count(&cluster.url()).await.unwrap(), 2);

        cluster.pause();
        let paused = tokio::time::timeout(Duration::from_millis(300), count(&cluster.url())).await;
        assert!(paused.is_err(), "a paused server answered");
        cluster.resume();
        assert_eq!(count(&cluster.url()).await.unwrap(), 2);
    }
}

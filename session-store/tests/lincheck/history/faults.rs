//! Faults under a running history: the store's process killed with SIGKILL
//! and started again on the same data (the same redb file, the same
//! PostgreSQL schema), and stopped with SIGSTOP until calls outlive their
//! deadline, then resumed with SIGCONT. Calls in flight across a kill fail
//! with UNAVAILABLE; calls into a paused store time out; both enter the
//! history as indeterminate. Clients go on after each fault.

use tokio::process::Command;

use clawgate_system_tests::process::{Process, service_command};
use clawgate_system_tests::wait::{poll, wait_until};
use session_store::backend::postgres;
use session_store::grpc::client::RemoteStore;

use super::*;

/// How long a store process may take to start and answer (a bound on a
/// broken one, not a measurement).
const START_LIMIT: Duration = Duration::from_secs(60);

/// Where the store keeps its data across kills.
enum Data {
    File(tempfile::TempDir),
    Postgres { schema: String },
}

/// The real `session-store` binary, restarted on the same data.
pub struct StoreProcess {
    data: Data,
    process: Option<Process>,
    generation: u64,
}

/// What the fault injector did.
#[derive(Debug, Default, Clone, Copy)]
pub struct FaultLog {
    pub kills: usize,
    pub pauses: usize,
}

impl StoreProcess {
    pub fn embedded() -> Self {
        Self::on(Data::File(tempfile::tempdir().unwrap()))
    }

    pub fn postgres() -> Self {
        let schema = format!("sstest_{}", uuid::Uuid::new_v4().simple());
        Self::on(Data::Postgres { schema })
    }

    fn on(data: Data) -> Self {
        Self {
            data,
            process: None,
            generation: 0,
        }
    }

    fn command(&self) -> Command {
        let mut command = service_command(env!("CARGO_BIN_EXE_session-store"));
        command.args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]);
        match &self.data {
            Data::File(dir) => command.arg("--store").arg(dir.path().join("store.redb")),
            Data::Postgres { schema } => {
                let url = suite::harness::postgres_url();
                command.args(["--store", &url, "--pg-schema", schema])
            }
        };
        command
    }

    /// Starts the process and connects once it answers.
    pub async fn start(&mut self) -> Connections {
        let process = Process::start(
            self.command(),
            "session-store",
            "session store serving gRPC",
        )
        .await;
        let url = process.url();
        let mut remotes: Vec<Arc<dyn SessionStore>> = Vec::new();
        for _ in 0..CONNECTIONS {
            let answered = poll("session-store to answer", START_LIMIT, async || {
                let remote = RemoteStore::connect(&url).await.ok()?;
                let probe = remote.list_leases().await;
                probe.is_ok().then_some(remote)
            })
            .await;
            let remote = answered.unwrap_or_else(|e| panic!("{e}:\n{}", process.output_text()));
            remotes.push(Arc::new(remote));
        }
        self.process = Some(process);
        self.generation += 1;
        Connections {
            generation: self.generation,
            remotes,
        }
    }

    fn process(&mut self) -> &mut Process {
        self.process.as_mut().expect("the store runs")
    }

    /// Kills the process for good and drops its PostgreSQL schema.
    pub async fn finish(mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill().await;
        }
        if let Data::Postgres { schema } = &self.data {
            let url = suite::harness::postgres_url();
            postgres::drop_schema(&url, schema)
                .await
                .expect("drop test schema");
        }
    }
}

/// Kills and pauses `store` while the clients run, `kills` and `pauses`
/// times, alternating, evenly spread over `total` operations.
pub async fn inject(
    shared: &Shared,
    store: &mut StoreProcess,
    total: usize,
    kills: usize,
    pauses: usize,
) -> FaultLog {
    let mut log = FaultLog::default();
    let faults = kills + pauses;
    for n in 0..faults {
        let at = (total * (n + 1) / (faults + 1)) as u64;
        let progress = format!("{at} of {total} operations done");
        wait_until(progress, OUTAGE_LIMIT, || {
            shared.done.load(Ordering::SeqCst) >= at
        })
        .await;
        let kill = match (kills - log.kills, pauses - log.pauses) {
            (0, _) => false,
            (_, 0) => true,
            _ => n % 2 == 0,
        };
        if kill {
            // Clients wait from their next call on; calls in flight fail.
            shared.store.send_replace(None);
            store.process().kill().await;
            let restarted = store.start().await;
            let ended = shared.clock.fetch_add(1, Ordering::SeqCst);
            shared
                .ended
                .lock()
                .unwrap()
                .insert(store.generation - 1, ended);
            shared.store.send_replace(Some(restarted));
            log.kills += 1;
        } else {
            let before = shared.timeouts.load(Ordering::SeqCst);
            store.process().signal("STOP");
            // Stopped until a call has outlived its deadline.
            let what = "a call to time out against the stopped store";
            wait_until(what, OUTAGE_LIMIT, || {
                shared.timeouts.load(Ordering::SeqCst) > before
            })
            .await;
            store.process().signal("CONT");
            log.pauses += 1;
        }
    }
    log
}

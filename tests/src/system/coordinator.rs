//! A system's coordinators: how each is started, and, with fault links,
//! the proxy in front of it (what the edges are given and what it
//! advertises, so that a restarted process keeps the address) and its own
//! link to the store (its only path to the database: cutting it is
//! cutting its database connection).

use std::time::Duration;

use tokio::time::Instant;

use super::{Role, System};
use crate::fault_proxy::FaultProxy;
use crate::process::Process;
use crate::wait::poll;

/// Short leases under lease ownership, so failovers take seconds.
pub const TTL: Duration = Duration::from_secs(2);
pub const RENEW: Duration = Duration::from_millis(400);

/// What a coordinator executes runs with.
#[derive(Debug, Clone)]
pub enum Runtime {
    /// The built-in echo: a reply in at most `chunks` pieces, `pace` apart.
    Echo { chunks: usize, pace: Duration },
    /// An agent runtime service at this URL (a counting one, say).
    Grpc(String),
}

/// How a coordinator is started: its runtime, its ownership, more flags.
#[derive(Debug, Clone)]
pub struct CoordinatorSpec {
    pub runtime: Runtime,
    /// Lease ownership ([`TTL`], [`RENEW`]) draining for up to this long at
    /// a graceful stop; static ownership when `None`.
    pub lease_drain: Option<Duration>,
    /// Under lease ownership: the lease TTL and the renew interval.
    pub lease_times: (Duration, Duration),
    /// Flags after the system's own (not to repeat those: clap refuses a
    /// flag given twice).
    pub args: Vec<String>,
}

impl Default for CoordinatorSpec {
    /// Static ownership, the echo in 4 pieces 20 ms apart.
    fn default() -> Self {
        Self {
            runtime: Runtime::Echo {
                chunks: 4,
                pace: Duration::from_millis(20),
            },
            lease_drain: None,
            lease_times: (TTL, RENEW),
            args: Vec::new(),
        }
    }
}

fn millis(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

impl CoordinatorSpec {
    /// Lease ownership with `runtime`, draining for up to `drain`.
    pub fn lease(runtime: Runtime, drain: Duration) -> Self {
        Self {
            runtime,
            lease_drain: Some(drain),
            lease_times: (TTL, RENEW),
            args: Vec::new(),
        }
    }

    /// Leases of `ttl`, renewed every `renew` (instead of [`TTL`] and
    /// [`RENEW`]).
    pub fn lease_times(mut self, ttl: Duration, renew: Duration) -> Self {
        self.lease_times = (ttl, renew);
        self
    }

    /// The echo runtime in at most `chunks` pieces, `pace` apart.
    pub fn echo(mut self, chunks: usize, pace: Duration) -> Self {
        self.runtime = Runtime::Echo { chunks, pace };
        self
    }

    /// More flags.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The flags of the runtime, the ownership and the extra ones.
    fn flags(&self) -> Vec<String> {
        let mut flags: Vec<String> = match &self.runtime {
            Runtime::Echo { chunks, pace } => vec![
                "--runtime".into(),
                "echo".into(),
                "--echo-chunks".into(),
                chunks.to_string(),
                "--echo-pace".into(),
                millis(*pace),
            ],
            Runtime::Grpc(url) => vec![
                "--runtime".into(),
                "grpc".into(),
                "--runtime-address".into(),
                url.clone(),
            ],
        };
        if let Some(drain) = self.lease_drain {
            flags.extend(["--ownership".into(), "lease".into()]);
            let (ttl, renew) = self.lease_times;
            flags.extend(["--lease-ttl".into(), millis(ttl)]);
            flags.extend(["--lease-renew-interval".into(), millis(renew)]);
            flags.extend(["--drain-timeout".into(), millis(drain)]);
        }
        flags.extend(self.args.iter().cloned());
        flags
    }
}

/// One coordinator of a system.
pub struct Coordinator {
    pub process: Process,
    /// With fault links: the proxy in front of it, at the address it
    /// advertises and the edges are given.
    front: Option<FaultProxy>,
    /// With fault links: its own path to the store.
    pub(super) store_link: Option<FaultProxy>,
    spec: CoordinatorSpec,
}

impl Coordinator {
    /// The address the others are given: its proxy's, or its own.
    pub fn url(&self) -> String {
        match &self.front {
            Some(front) => front.url(),
            None => self.process.url(),
        }
    }

    /// The proxy in front of it (a system with fault links): what the
    /// edges reach it through.
    pub fn front(&self) -> &FaultProxy {
        self.front.as_ref().expect("a system with fault links")
    }

    /// Its own path to the store (a system with fault links): cut or
    /// partition it to cut it off from the database.
    pub fn store_link(&self) -> &FaultProxy {
        self.store_link.as_ref().expect("a system with fault links")
    }

    /// Whether it reports gRPC health SERVING (it holds partitions).
    pub async fn serving(&self) -> bool {
        serving(&self.process).await
    }

    /// Waits until it serves; how long that took from `since`. Panics with
    /// its output after `within`.
    pub async fn until_serving(&self, since: Instant, within: Duration) -> Duration {
        let what = format!("{} to serve", self.process.name);
        if let Err(timed_out) = poll(what, within, async || self.serving().await).await {
            panic!("{timed_out}:\n{}", self.process.output_text());
        }
        since.elapsed()
    }
}

/// Whether the coordinator `process` reports gRPC health SERVING.
pub async fn serving(process: &Process) -> bool {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(process.url()).unwrap();
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    let request = HealthCheckRequest {
        service: "clawgate.run_coordinator.v1.RunCoordinator".into(),
    };
    HealthClient::new(channel)
        .check(request)
        .await
        .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
}

impl System {
    /// Starts one more coordinator as `spec` says (behind fault links if
    /// the system has them); its index. Not waited for: a lease-mode one
    /// may stand by.
    pub async fn add_coordinator(&mut self, spec: CoordinatorSpec) -> usize {
        let (front, store_link) = match self.fault_links {
            // The front's upstream is set once the process announced its
            // address; until then it points at the discard port.
            true => (
                Some(FaultProxy::start("127.0.0.1:9".parse().unwrap()).await),
                Some(FaultProxy::start(self.stores[0].address).await),
            ),
            false => (None, None),
        };
        let process = self
            .launch_coordinator(&spec, front.as_ref(), store_link.as_ref())
            .await;
        self.coordinators.push(Coordinator {
            process,
            front,
            store_link,
            spec,
        });
        self.coordinators.len() - 1
    }

    /// SIGKILLs coordinator `n` (if it still runs) and starts it again as
    /// before, behind the same proxies.
    pub async fn restart_coordinator(&mut self, n: usize) {
        self.coordinators[n].process.kill().await;
        let coordinator = &self.coordinators[n];
        let process = self
            .launch_coordinator(
                &coordinator.spec,
                coordinator.front.as_ref(),
                coordinator.store_link.as_ref(),
            )
            .await;
        self.coordinators[n].process = process;
    }

    async fn launch_coordinator(
        &self,
        spec: &CoordinatorSpec,
        front: Option<&FaultProxy>,
        store_link: Option<&FaultProxy>,
    ) -> Process {
        let store_url = store_link.map_or_else(|| self.store_url(), FaultProxy::url);
        let mut flags = vec!["--metrics-listen".into(), "127.0.0.1:0".into()];
        flags.extend(["--store-address".into(), store_url]);
        if let Some(front) = front {
            flags.extend(["--advertise-address".into(), front.url()]);
        }
        flags.extend(spec.flags());
        let process = self.spawn(Role::Coordinator, &flags).await;
        if let Some(front) = front {
            front.set_upstream(process.address);
        }
        process
    }

    /// The coordinator that serves (holds partitions), if any.
    pub async fn leader(&self) -> Option<usize> {
        for (n, coordinator) in self.coordinators.iter().enumerate() {
            if coordinator.serving().await {
                return Some(n);
            }
        }
        None
    }
}

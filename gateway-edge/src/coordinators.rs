//! Which run coordinator the edge talks to: the leader.
//!
//! The edge is given one or more coordinator addresses
//! (`--coordinator-address a,b`). Only the coordinator owning the
//! partitions serves; the others answer UNAVAILABLE with `NOT_OWNER` and,
//! when they know it, the leader's address. The edge follows: on UNAVAILABLE
//! it switches to the hinted leader, else to the owner the store's leases
//! name, else to the next configured address, and retries the call. Only
//! idempotent calls are retried (Submit with the same runId, Get, Wait,
//! Cancel, ListActive, Subscribe), until the failover timeout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_telemetry::{ServiceTokens, TracedChannel, service_channel};
use session_store_api::SessionStore;
use session_store_api::grpc::client::RemoteStore;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic::{Code, Status};

pub type CoordinatorClient = RunCoordinatorClient<TracedChannel>;

const DETAIL_TYPE_URL: &str =
    "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail";

pub struct Coordinators {
    /// HTTP/2 keepalive on every coordinator connection: a leader that stops
    /// answering (SIGSTOP, a partition) fails its calls and streams after at
    /// most twice this, so they follow the new leader instead of hanging.
    keepalive: Duration,
    /// The service token its calls carry.
    tokens: Option<ServiceTokens>,
    /// The configured addresses, in order.
    candidates: Vec<String>,
    /// The address in use and its client.
    current: RwLock<(String, CoordinatorClient)>,
    /// One lazily connected client per address ever used.
    clients: Mutex<HashMap<String, CoordinatorClient>>,
    store: RemoteStore,
    failover_timeout: Duration,
}

/// The machine-readable detail of a coordinator's error, if it has one.
pub fn error_detail(status: &Status) -> Option<pb::CoordinatorErrorDetail> {
    clawgate_proto::status_detail::detail_of(status, DETAIL_TYPE_URL)
}

/// The leader's address a coordinator's error names, if any.
pub fn leader_hint(status: &Status) -> Option<String> {
    error_detail(status)
        .and_then(|d| d.leader_address)
        .filter(|a| !a.is_empty())
}

/// Whether the coordinator refused a Submit because the session's settings
/// are not those it was made from (nothing was admitted).
pub fn settings_changed(status: &Status) -> bool {
    error_detail(status).is_some_and(|d| d.code == pb::ErrorCode::SettingsChanged as i32)
}

/// Whether another coordinator may answer where this one did not.
pub fn should_fail_over(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

fn client_for(
    address: &str,
    keepalive: Duration,
    tokens: Option<&ServiceTokens>,
) -> anyhow::Result<CoordinatorClient> {
    let endpoint = Endpoint::from_shared(address.to_owned())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(keepalive)
        .keep_alive_timeout(keepalive)
        .keep_alive_while_idle(true);
    let channel = service_channel(endpoint.connect_lazy(), endpoint.uri(), tokens);
    Ok(RunCoordinatorClient::new(channel)
        .max_decoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES))
}

/// The coordinator's calls, each following the leader (see `call`).
macro_rules! forward {
    ($($name:ident($request:ty) -> $response:ty;)*) => {$(
        pub async fn $name(&self, req: $request) -> Result<$response, Status> {
            self.call(|mut c| {
                let req = req.clone();
                async move { c.$name(req).await }
            })
            .await
        }
    )*};
}

impl Coordinators {
    /// `addresses`: comma-separated; the first is used first.
    pub fn new(
        addresses: &str,
        store: RemoteStore,
        failover_timeout: Duration,
        keepalive: Duration,
        tokens: Option<ServiceTokens>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !keepalive.is_zero(),
            "the coordinator keepalive must be above zero"
        );
        let candidates: Vec<String> = addresses
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        anyhow::ensure!(!candidates.is_empty(), "no run coordinator address given");
        let mut clients = HashMap::new();
        for address in &candidates {
            clients.insert(
                address.clone(),
                client_for(address, keepalive, tokens.as_ref())?,
            );
        }
        let first = (candidates[0].clone(), clients[&candidates[0]].clone());
        Ok(Self {
            keepalive,
            tokens,
            candidates,
            current: RwLock::new(first),
            clients: Mutex::new(clients),
            store,
            failover_timeout,
        })
    }

    /// The client of the coordinator in use.
    pub fn client(&self) -> CoordinatorClient {
        self.current.read().unwrap().1.clone()
    }

    pub fn current_address(&self) -> String {
        self.current.read().unwrap().0.clone()
    }

    fn switch_to(&self, address: &str) {
        let client = {
            let mut clients = self.clients.lock().unwrap();
            if let Some(client) = clients.get(address) {
                client.clone()
            } else {
                match client_for(address, self.keepalive, self.tokens.as_ref()) {
                    Ok(client) => {
                        clients.insert(address.to_owned(), client.clone());
                        client
                    }
                    Err(err) => {
                        tracing::warn!(%address, error = %err, "unusable coordinator address");
                        return;
                    }
                }
            }
        };
        let mut current = self.current.write().unwrap();
        if current.0 != address {
            tracing::info!(from = %current.0, to = %address, "following the run coordinator leader");
            *current = (address.to_owned(), client);
        }
    }

    /// Picks the coordinator to use after `from` failed: the hinted
    /// leader, else the owner of most live leases, else the next
    /// configured address.
    pub async fn follow_leader(&self, from: &str, hint: Option<String>) {
        if self.current_address() != from {
            return; // another call already moved on
        }
        if let Some(leader) = hint {
            self.switch_to(&leader);
            return;
        }
        if let Some(owner) = self.owner_from_leases().await
            && owner != from
        {
            self.switch_to(&owner);
            return;
        }
        let at = self.candidates.iter().position(|a| a == from);
        let next = match at {
            Some(i) => &self.candidates[(i + 1) % self.candidates.len()],
            None => &self.candidates[0],
        };
        self.switch_to(next);
    }

    async fn owner_from_leases(&self) -> Option<String> {
        let table = self.store.list_leases().await.ok()?;
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for lease in &table.leases {
            if lease.owner.is_some()
                && lease.expires_at_ms > table.now_ms
                && !lease.address.is_empty()
            {
                *counts.entry(lease.address.as_str()).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(a, _)| a.to_owned())
    }

    /// Runs an idempotent call against the leader, following it through a
    /// failover: on UNAVAILABLE the call is retried (with backoff) on the
    /// coordinator `follow_leader` picks, until the failover timeout.
    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, Status>
    where
        F: FnMut(CoordinatorClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.failover_timeout;
        let mut backoff = Duration::from_millis(50);
        loop {
            let (address, client) = self.current.read().unwrap().clone();
            let status = match call(client).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if !should_fail_over(&status) || Instant::now() + backoff > deadline {
                return Err(status);
            }
            tracing::debug!(%address, error = %status, "run coordinator unavailable; following the leader");
            self.follow_leader(&address, leader_hint(&status)).await;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    forward! {
        submit(pb::SubmitRequest) -> pb::SubmitResponse;
        get(pb::GetRequest) -> pb::GetResponse;
        wait(pb::WaitRequest) -> pb::WaitResponse;
        cancel(pb::CancelRequest) -> pb::CancelResponse;
        list_active(pb::ListActiveRequest) -> pb::ListActiveResponse;
        describe_runtime(pb::DescribeRuntimeRequest) -> pb::DescribeRuntimeResponse;
        subscribe(pb::SubscribeRequest) -> tonic::Streaming<pb::SubscribeResponse>;
    }
}

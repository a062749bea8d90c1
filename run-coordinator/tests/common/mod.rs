//! What the coordinator's tests share beyond the test kit
//! (`clawgate-system-tests`, whose sandbox and waits are re-exported here):
//! runtimes that record every execution or hold a run, requests and their
//! checks, and a coordinator in this process without any socket for tests
//! on paused time ([`Local`]).
// Each test binary uses a part of this module, the re-exports included.
#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use futures::StreamExt;
use run_coordinator::Coordinator;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::runtime::{AgentRuntime, RuntimeError, RuntimeRequest, RuntimeStream};
use session_store::grpc::client::RemoteStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use clawgate_system_tests::sandbox::{Backend, Sandbox};
pub use clawgate_system_tests::wait::{wait_for, wait_until};

/// How long a test waits for what it expects: a bound on a broken
/// coordinator, never a measurement.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// One execution as the runtime saw it.
#[derive(Debug, Clone)]
pub struct Execution {
    pub run_id: String,
    pub started: Instant,
    pub ended: Option<Instant>,
    pub cancelled: bool,
}

/// Wraps a runtime and records when each execution starts and ends.
pub struct Recording {
    inner: Arc<dyn AgentRuntime>,
    pub log: Arc<Mutex<Vec<Execution>>>,
}

impl Recording {
    pub fn echo(pace_ms: u64, chunks: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(EchoRuntime::new(EchoConfig {
                chunks,
                pace: Duration::from_millis(pace_ms),
            })),
            log: Arc::default(),
        })
    }

    pub fn executions(&self) -> Vec<Execution> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self, run_id: &str) -> usize {
        self.executions()
            .iter()
            .filter(|e| e.run_id == run_id)
            .count()
    }

    /// Most executions that overlapped at any moment.
    pub fn max_concurrency(&self) -> usize {
        let executions = self.executions();
        let mut points: Vec<(Instant, i32)> = Vec::new();
        for e in &executions {
            points.push((e.started, 1));
            points.push((e.ended.expect("every execution ended"), -1));
        }
        // Ends before starts at the same instant.
        points.sort_by_key(|(t, d)| (*t, *d));
        let (mut now, mut max) = (0, 0);
        for (_, d) in points {
            now += d;
            max = max.max(now);
        }
        max as usize
    }
}

/// Records the end when the stream is dropped (finished or abandoned).
struct EndGuard {
    log: Arc<Mutex<Vec<Execution>>>,
    index: usize,
    cancel: CancellationToken,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap();
        log[self.index].ended = Some(Instant::now());
        log[self.index].cancelled = self.cancel.is_cancelled();
    }
}

#[async_trait]
impl AgentRuntime for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        let index = {
            let mut log = self.log.lock().unwrap();
            log.push(Execution {
                run_id: request.run_id.clone(),
                started: Instant::now(),
                ended: None,
                cancelled: false,
            });
            log.len() - 1
        };
        let guard = EndGuard {
            log: self.log.clone(),
            index,
            cancel: cancel.clone(),
        };
        let stream = self.inner.execute(request, cancel).await?;
        Ok(stream
            .map(move |item| {
                let _ = &guard;
                item
            })
            .boxed())
    }
}

/// A client of the coordinator at `url` on a connection of its own.
pub async fn connect(url: &str) -> RunCoordinatorClient<Channel> {
    RunCoordinatorClient::connect(url.to_owned()).await.unwrap()
}

/// An in-process Submit of a chat turn (`enqueue`) to `session`.
pub fn request(run_id: &str, session: &str) -> run_coordinator_api::model::SubmitRequest {
    run_coordinator_api::model::SubmitRequest {
        run_id: run_id.into(),
        session_key: session_store::SessionKey::parse(session).unwrap(),
        spec: run_coordinator_api::model::RunSpec {
            kind: "chat".into(),
            message: format!("message of {run_id}"),
            queue_mode: run_coordinator_api::model::QueueMode::Enqueue,
            timeout_ms: None,
            options: serde_json::json!({}),
            requester: String::new(),
            label: None,
            attachments: Vec::new(),
        },
        expected_settings: None,
        create_session: false,
    }
}

pub fn submit_req(run_id: &str, session: &str, message: &str) -> pb::SubmitRequest {
    pb::SubmitRequest {
        run_id: run_id.into(),
        session_key: session.into(),
        kind: "agent".into(),
        message: message.into(),
        ..Default::default()
    }
}

pub async fn submit(
    client: &mut RunCoordinatorClient<Channel>,
    req: pb::SubmitRequest,
) -> pb::SubmitResponse {
    client.submit(req).await.expect("submit").into_inner()
}

pub async fn wait(
    client: &mut RunCoordinatorClient<Channel>,
    run_id: &str,
    timeout_ms: u64,
) -> pb::WaitResponse {
    client
        .wait(pb::WaitRequest {
            run_id: run_id.into(),
            timeout_ms,
        })
        .await
        .expect("wait")
        .into_inner()
}

/// Waits for a terminal snapshot (generous bound; a broken run fails here).
pub async fn finished(client: &mut RunCoordinatorClient<Channel>, run_id: &str) -> pb::RunSnapshot {
    let waited = wait(client, run_id, 60_000).await;
    assert!(waited.terminal, "run {run_id} did not finish: {waited:?}");
    waited.snapshot.unwrap()
}

pub fn status(snapshot: &pb::RunSnapshot) -> session_store::model::RunStatus {
    session_store::grpc::convert::status_from_pb(snapshot.status)
        .unwrap()
        .expect("a status")
}

/// The run's snapshot once `check` holds (naming `what` it waits for);
/// the snapshot that held.
pub async fn until_snapshot(
    cluster: &Sandbox,
    run_id: &str,
    what: &str,
    check: impl Fn(&pb::RunSnapshot) -> bool,
) -> pb::RunSnapshot {
    let mut client = cluster.client();
    wait_for(format!("{run_id}: {what}"), DEADLINE, async || {
        let snapshot = client
            .get(pb::GetRequest {
                run_id: run_id.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        if check(&snapshot) {
            Ok(snapshot)
        } else {
            Err(format!("{snapshot:?}"))
        }
    })
    .await
}

pub fn counts(executions: &[Execution]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for e in executions {
        *counts.entry(e.run_id.clone()).or_default() += 1;
    }
    counts
}

/// A session's whole current transcript, read from the store.
pub async fn transcript(
    cluster: &Sandbox,
    key: &str,
) -> Vec<session_store::model::TranscriptEntry> {
    use session_store::SessionStore;
    use session_store::model::{HistoryCursor, HistoryQuery};
    cluster
        .store
        .history(HistoryQuery {
            key: session_store::SessionKey::parse(key).unwrap(),
            limit: 1000,
            cursor: HistoryCursor::After(0),
            max_chars: None,
            session_id: None,
        })
        .await
        .unwrap()
        .entries
}

/// Cancels one run by id; the snapshots the coordinator answers with.
pub async fn cancel_run(
    client: &mut RunCoordinatorClient<Channel>,
    run_id: &str,
) -> pb::CancelResponse {
    client
        .cancel(pb::CancelRequest {
            target: Some(pb::cancel_request::Target::RunId(run_id.into())),
            requester: "tester".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Appends an empty assistant entry with the session and fence `snapshot`
/// held, under the partition's current owner token: what a zombie or
/// superseded executor of the owning coordinator would try.
pub async fn append_with_fence_of(
    store: &RemoteStore,
    snapshot: &pb::RunSnapshot,
) -> session_store::StoreResult<session_store::model::Appended> {
    use session_store::SessionStore;
    use session_store::model::{AppendEntries, EntryMetadata, NewEntry};
    let key = session_store::SessionKey::parse(&snapshot.session_key).unwrap();
    let table = store.list_leases().await.unwrap();
    let partition = clawgate_common::partition::partition_of(key.as_str(), table.partition_count);
    let owner_token = table.leases[partition as usize].token();
    store
        .append(AppendEntries {
            owner_token,
            key,
            session_id: snapshot.session_id.as_deref().unwrap().parse().unwrap(),
            run_id: snapshot.run_id.clone(),
            fence_token: snapshot.fence_token.unwrap(),
            entries: vec![NewEntry {
                role: "assistant".into(),
                content_json: "[]".into(),
                timestamp_ms: None,
                metadata: EntryMetadata::default(),
            }],
        })
        .await
}

/// A coordinator in this process over the in-memory store: no socket and no
/// blocking thread, so paused tokio time drives all of it (a test with
/// `start_paused` sees every timer of the coordinator and its runtime in
/// virtual time). The store counts what it serves.
pub struct Local {
    pub coordinator: Coordinator,
    registry: prometheus_client::registry::Registry,
}

impl Local {
    pub async fn start(runtime: Arc<dyn AgentRuntime>, config: CoordinatorConfig) -> Self {
        let store_metrics = session_store::metrics::StoreMetrics::default();
        let store = session_store::metrics::Metered::new(
            session_store::backend::memory::MemoryStore::new(),
            store_metrics.clone(),
        );
        let coordinator = Coordinator::start(Arc::new(store), runtime, config)
            .await
            .unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        store_metrics.register(&mut registry);
        Self {
            coordinator,
            registry,
        }
    }

    /// Calls of `operation` (its metric label, e.g. `get_run`) the store
    /// has served so far, answered or refused.
    pub fn served(&self, operation: &str) -> u64 {
        let text = clawgate_telemetry::metrics::encode(&self.registry).unwrap();
        ["ok", "error"]
            .iter()
            .map(|outcome| {
                let labels = format!("{{operation=\"{operation}\",outcome=\"{outcome}\"}}");
                clawgate_telemetry::metrics::sample_value(
                    &text,
                    "clawgate_store_operation_duration_seconds_count",
                    &labels,
                )
                .unwrap_or(0.0) as u64
            })
            .sum()
    }

    pub async fn submit(
        &self,
        run_id: &str,
        session: &str,
        message: &str,
    ) -> run_coordinator_api::model::Submitted {
        self.submit_with(run_id, session, message, serde_json::json!({}))
            .await
    }

    pub async fn submit_with(
        &self,
        run_id: &str,
        session: &str,
        message: &str,
        options: serde_json::Value,
    ) -> run_coordinator_api::model::Submitted {
        self.coordinator
            .submit(local_req(run_id, session, message, options))
            .await
            .unwrap_or_else(|e| panic!("submit {run_id}: {e}"))
    }

    pub async fn get(&self, run_id: &str) -> Option<run_coordinator_api::model::RunSnapshot> {
        self.coordinator.get(run_id).await.unwrap()
    }

    /// The run's terminal snapshot (a day of virtual time at most).
    pub async fn finished(&self, run_id: &str) -> run_coordinator_api::model::RunSnapshot {
        let waited = self
            .coordinator
            .wait(run_id, Duration::from_secs(86_400))
            .await
            .unwrap();
        assert!(waited.terminal, "{run_id} did not finish: {waited:?}");
        waited.snapshot.unwrap()
    }

    /// The run's snapshot once `check` holds (a virtual minute at most,
    /// naming `what`).
    pub async fn until(
        &self,
        run_id: &str,
        what: &str,
        check: impl Fn(&run_coordinator_api::model::RunSnapshot) -> bool,
    ) -> run_coordinator_api::model::RunSnapshot {
        let within = Duration::from_secs(60);
        wait_for(format!("{run_id}: {what}"), within, async || {
            match self.get(run_id).await {
                Some(snapshot) if check(&snapshot) => Ok(snapshot),
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }
}

pub fn local_req(
    run_id: &str,
    session: &str,
    message: &str,
    options: serde_json::Value,
) -> run_coordinator_api::model::SubmitRequest {
    run_coordinator_api::model::SubmitRequest {
        run_id: run_id.into(),
        session_key: session_store::SessionKey::parse(session).unwrap(),
        spec: run_coordinator_api::model::RunSpec {
            kind: "agent".into(),
            message: message.into(),
            queue_mode: run_coordinator_api::model::QueueMode::Enqueue,
            timeout_ms: None,
            options,
            requester: String::new(),
            label: None,
            attachments: Vec::new(),
        },
        expected_settings: None,
        create_session: false,
    }
}

/// Echo for most runs; a run whose options say `hold` streams one delta,
/// then holds until `release` fires (or it is cancelled) and finishes.
pub struct Holding {
    pub echo: Arc<Recording>,
    pub release: CancellationToken,
}

impl Holding {
    pub fn over(echo: Arc<Recording>) -> Arc<Self> {
        Arc::new(Self {
            echo,
            release: CancellationToken::new(),
        })
    }
}

#[async_trait]
impl AgentRuntime for Holding {
    fn name(&self) -> &'static str {
        "holding"
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        if request.options["hold"] != true {
            return self.echo.execute(request, cancel).await;
        }
        let release = self.release.clone();
        let finish = async move {
            tokio::select! {
                () = release.cancelled() => Some(Ok(run_coordinator::runtime::RuntimeEvent::Finished {
                    stop_reason: "stop".into(),
                })),
                () = cancel.cancelled() => None,
            }
        };
        let delta = futures::stream::iter([Ok(
            run_coordinator::runtime::RuntimeEvent::AssistantDelta("partial".into()),
        )]);
        Ok(delta
            .chain(futures::stream::once(finish).filter_map(std::future::ready))
            .boxed())
    }
}

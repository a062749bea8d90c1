//! The external gRPC runtime, both ways round.
//!
//! * [`GrpcRuntime`] is an [`AgentRuntime`] that runs each execution through
//!   an external service implementing `clawgate.agent_runtime.v1.AgentRuntime`.
//! * [`serve_runtime`] exposes any Rust [`AgentRuntime`] as that service, so
//!   the echo runtime (or a test's runtime) can run as a separate process.
//!
//! Cancellation crosses the wire twice, as the contract asks: the client
//! drops the `Execute` stream (an HTTP/2 reset, which the server adapter
//! turns into a cancelled token) and also calls `Cancel` with the run id, for
//! runtimes whose work outlives the call.

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_proto::agent_runtime::v1 as pb;
use clawgate_proto::agent_runtime::v1::agent_runtime_client::AgentRuntimeClient;
use clawgate_proto::agent_runtime::v1::agent_runtime_server::{self, AgentRuntimeServer};
use clawgate_telemetry::{TracedChannel, traced_channel};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tonic::{Code, Status, Streaming};

use super::{
    AgentRuntime, ErrorKind, HistoryMessage, ModelCatalog, ModelInfo, RuntimeError, RuntimeEvent,
    RuntimeRequest, RuntimeStream, Usage,
};

/// Largest message either side accepts (requests carry the history).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long the best-effort `Cancel` call may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct GrpcRuntimeConfig {
    /// Bound on establishing the connection (per attempt; the channel
    /// reconnects lazily when the runtime comes back).
    pub connect_timeout: Duration,
    /// Bound on one whole `Execute` call, stream included. `None`: only the
    /// run's deadline (which the coordinator enforces) applies.
    pub request_timeout: Option<Duration>,
}

impl Default for GrpcRuntimeConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
        }
    }
}

/// An [`AgentRuntime`] backed by an external `AgentRuntime` gRPC service.
#[derive(Debug, Clone)]
pub struct GrpcRuntime {
    client: AgentRuntimeClient<TracedChannel>,
    address: Arc<str>,
    request_timeout: Option<Duration>,
}

impl GrpcRuntime {
    /// Prepares a channel to `address` (`http://host:port`; a bare
    /// `host:port` gets `http://`). The connection is made lazily, on the
    /// first call, so the coordinator can start before the runtime; an
    /// unreachable runtime shows up as a retryable error from `execute`.
    pub async fn connect(address: &str, config: GrpcRuntimeConfig) -> Result<Self, RuntimeError> {
        let uri = if address.contains("://") {
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| {
                RuntimeError::new(
                    ErrorKind::Unknown,
                    format!("bad agent runtime address {address:?}: {e}"),
                    false,
                )
            })?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true);
        let channel = traced_channel(endpoint.connect_lazy(), endpoint.uri());
        let client = AgentRuntimeClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self {
            client,
            address: address.into(),
            request_timeout: config.request_timeout,
        })
    }

    /// The address this runtime calls, as configured.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn timed_out(&self) -> RuntimeError {
        timeout_error(&self.address, self.request_timeout.unwrap_or_default())
    }
}

#[async_trait]
impl AgentRuntime for GrpcRuntime {
    fn name(&self) -> &'static str {
        "grpc"
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        if cancel.is_cancelled() {
            return Ok(futures::stream::empty().boxed());
        }
        let run_id = request.run_id.clone();
        let deadline = self.request_timeout.map(|t| Instant::now() + t);

        // `stop` fires with the caller's token, or when the request timeout
        // abandons the call; either way the runtime is told through `Cancel`.
        // `done` fires when the call is over (or its stream is dropped); the
        // watcher checks `stop` first, so a cancellation that raced with the
        // end of the stream still reaches the runtime.
        let stop = cancel.child_token();
        let done = CancellationToken::new();
        tokio::spawn(watch_for_cancel(
            self.client.clone(),
            self.address.clone(),
            run_id.clone(),
            stop.clone(),
            done.clone(),
        ));
        let done = done.drop_guard();

        let mut call = tonic::Request::new(request_to_pb(request));
        if let Some(timeout) = self.request_timeout {
            call.set_timeout(timeout);
        }
        let mut client = self.client.clone();
        let started = tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(futures::stream::empty().boxed()),
            () = sleep_until(deadline) => {
                stop.cancel();
                return Err(self.timed_out());
            }
            started = client.execute(call) => started,
        };
        let events = started
            .map_err(|status| status_to_error(&self.address, &status))?
            .into_inner();

        let call = Call {
            events: Some(events),
            stop,
            deadline,
            address: self.address.clone(),
            timeout: self.request_timeout,
            done: done.disarm(),
        };
        Ok(futures::stream::unfold(call, Call::next).fuse().boxed())
    }

    /// The runtime's `ListModels`; one that does not implement it offers
    /// none by name.
    async fn models(&self) -> Result<ModelCatalog, RuntimeError> {
        let mut call = tonic::Request::new(pb::ListModelsRequest {});
        call.set_timeout(CANCEL_TIMEOUT);
        match self.client.clone().list_models(call).await {
            Ok(response) => Ok(catalog_from_pb(response.into_inner())),
            Err(status) if status.code() == Code::Unimplemented => Ok(ModelCatalog::default()),
            Err(status) => Err(status_to_error(&self.address, &status)),
        }
    }
}

fn catalog_from_pb(response: pb::ListModelsResponse) -> ModelCatalog {
    ModelCatalog {
        models: response
            .models
            .into_iter()
            .map(|m| ModelInfo {
                id: m.id,
                name: m.name,
                provider: m.provider,
                context_window: (m.context_window > 0).then_some(m.context_window),
                reasoning: m.reasoning,
                input: m.input,
            })
            .collect(),
        default_model: Some(response.default_model).filter(|m| !m.is_empty()),
    }
}

/// A catalog in the contract's words (also what the coordinator answers
/// `DescribeRuntime` with).
pub fn catalog_to_pb(catalog: ModelCatalog) -> pb::ListModelsResponse {
    pb::ListModelsResponse {
        models: catalog
            .models
            .into_iter()
            .map(|m| pb::Model {
                id: m.id,
                name: m.name,
                provider: m.provider,
                context_window: m.context_window.unwrap_or(0),
                reasoning: m.reasoning,
                input: m.input,
            })
            .collect(),
        default_model: catalog.default_model.unwrap_or_default(),
    }
}

fn timeout_error(address: &str, timeout: Duration) -> RuntimeError {
    RuntimeError::new(
        ErrorKind::Timeout,
        format!("agent runtime at {address} did not finish within {timeout:?}"),
        true,
    )
}

/// The state of one `Execute` call's stream.
struct Call {
    /// `None` once the call is over; dropping it resets the HTTP/2 stream.
    events: Option<Streaming<pb::RuntimeEvent>>,
    stop: CancellationToken,
    deadline: Option<Instant>,
    address: Arc<str>,
    timeout: Option<Duration>,
    /// Tells the cancel watcher the call is over: fired at the end of the
    /// call, or when this state drops.
    done: CancellationToken,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.done.cancel();
    }
}

impl Call {
    async fn next(mut self) -> Option<(Result<RuntimeEvent, RuntimeError>, Self)> {
        loop {
            let events = self.events.as_mut()?;
            let received = tokio::select! {
                biased;
                // Checked first, so the stream ends at once when cancelled
                // however fast the server keeps sending.
                () = self.stop.cancelled() => return None,
                () = sleep_until(self.deadline) => {
                    self.events = None;
                    self.stop.cancel();
                    let error = timeout_error(&self.address, self.timeout.unwrap_or_default());
                    return Some((Err(error), self));
                }
                received = events.message() => received,
            };
            let item = match received {
                Ok(Some(event)) => match event_from_pb(event) {
                    Some(item) => item,
                    None => continue,
                },
                Ok(None) => return None,
                Err(status) => Err(status_to_error(&self.address, &status)),
            };
            // `finished` and `failed` (or a broken call) end the stream; the
            // runtime is done, so a later cancellation need not reach it.
            if matches!(item, Err(_) | Ok(RuntimeEvent::Finished { .. })) {
                self.events = None;
                self.done.cancel();
            }
            return Some((item, self));
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Calls `Cancel` once `stop` fires, unless the call ended first.
async fn watch_for_cancel(
    mut client: AgentRuntimeClient<TracedChannel>,
    address: Arc<str>,
    run_id: String,
    stop: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        biased;
        () = stop.cancelled() => {}
        () = done.cancelled() => return,
    }
    let mut request = tonic::Request::new(pb::CancelRequest {
        run_id: run_id.clone(),
    });
    request.set_timeout(CANCEL_TIMEOUT);
    match tokio::time::timeout(CANCEL_TIMEOUT, client.cancel(request)).await {
        Ok(Ok(response)) => tracing::debug!(
            %run_id,
            %address,
            cancelled = response.get_ref().cancelled,
            "agent runtime acknowledged cancel"
        ),
        Ok(Err(status)) => tracing::debug!(
            %run_id,
            %address,
            code = ?status.code(),
            message = status.message(),
            "agent runtime cancel failed"
        ),
        Err(_) => tracing::debug!(%run_id, %address, "agent runtime cancel timed out"),
    }
}

/// Maps a gRPC status from the runtime service to a runtime error.
pub fn status_to_error(address: &str, status: &Status) -> RuntimeError {
    let (kind, retryable) = match status.code() {
        Code::Unavailable => (ErrorKind::Unknown, true),
        Code::DeadlineExceeded => (ErrorKind::Timeout, true),
        Code::ResourceExhausted => (ErrorKind::RateLimit, true),
        _ => (ErrorKind::Unknown, false),
    };
    let mut message = format!("agent runtime at {address}: {:?}", status.code());
    if !status.message().is_empty() {
        message.push_str(": ");
        message.push_str(status.message());
    }
    // Transport failures keep the useful part ("connection refused") in the
    // source chain.
    let mut source = status.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    RuntimeError::new(kind, message, retryable)
}

fn request_to_pb(request: RuntimeRequest) -> pb::ExecuteRequest {
    let options_json = if request.options.is_null() {
        "{}".to_owned()
    } else {
        request.options.to_string()
    };
    pb::ExecuteRequest {
        run_id: request.run_id,
        session_key: request.session_key,
        session_id: request.session_id,
        message: request.message,
        history: request
            .history
            .into_iter()
            .map(|m| pb::HistoryMessage {
                role: m.role,
                content_json: m.content_json,
            })
            .collect(),
        options_json,
        deadline_ms: request.deadline_ms.unwrap_or(0),
    }
}

fn request_from_pb(request: pb::ExecuteRequest) -> Result<RuntimeRequest, Status> {
    if request.run_id.is_empty() {
        return Err(Status::invalid_argument("run_id is required"));
    }
    let options = if request.options_json.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&request.options_json)
            .map_err(|e| Status::invalid_argument(format!("options_json is not JSON: {e}")))?
    };
    Ok(RuntimeRequest {
        run_id: request.run_id,
        session_key: request.session_key,
        session_id: request.session_id,
        message: request.message,
        history: request
            .history
            .into_iter()
            .map(|m| HistoryMessage {
                role: m.role,
                content_json: m.content_json,
            })
            .collect(),
        options,
        deadline_ms: (request.deadline_ms != 0).then_some(request.deadline_ms),
    })
}

/// `None` for an event this side does not know (a newer contract).
fn event_from_pb(event: pb::RuntimeEvent) -> Option<Result<RuntimeEvent, RuntimeError>> {
    use pb::runtime_event::Event;
    Some(Ok(match event.event? {
        Event::AssistantDelta(d) => RuntimeEvent::AssistantDelta(d.text),
        Event::ToolStart(t) => RuntimeEvent::ToolStart {
            tool_call_id: t.tool_call_id,
            name: t.name,
            arguments_json: t.arguments_json,
        },
        Event::ToolUpdate(t) => RuntimeEvent::ToolUpdate {
            tool_call_id: t.tool_call_id,
            partial_json: t.partial_json,
        },
        Event::ToolResult(t) => RuntimeEvent::ToolResult {
            tool_call_id: t.tool_call_id,
            result_json: t.result_json,
            is_error: t.is_error,
        },
        Event::Usage(u) => RuntimeEvent::Usage(Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            total_tokens: u.total_tokens,
        }),
        Event::Finished(f) => RuntimeEvent::Finished {
            stop_reason: f.stop_reason,
        },
        Event::Failed(f) => {
            let kind = kind_from_pb(f.kind());
            return Some(Err(RuntimeError::new(kind, f.message, f.retryable)));
        }
    }))
}

fn event_to_pb(event: RuntimeEvent) -> pb::RuntimeEvent {
    use pb::runtime_event::Event;
    let event = match event {
        RuntimeEvent::AssistantDelta(text) => Event::AssistantDelta(pb::AssistantDelta { text }),
        RuntimeEvent::ToolStart {
            tool_call_id,
            name,
            arguments_json,
        } => Event::ToolStart(pb::ToolStart {
            tool_call_id,
            name,
            arguments_json,
        }),
        RuntimeEvent::ToolUpdate {
            tool_call_id,
            partial_json,
        } => Event::ToolUpdate(pb::ToolUpdate {
            tool_call_id,
            partial_json,
        }),
        RuntimeEvent::ToolResult {
            tool_call_id,
            result_json,
            is_error,
        } => Event::ToolResult(pb::ToolResult {
            tool_call_id,
            result_json,
            is_error,
        }),
        RuntimeEvent::Usage(u) => Event::Usage(pb::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            total_tokens: u.total_tokens,
        }),
        RuntimeEvent::Finished { stop_reason } => Event::Finished(pb::Finished { stop_reason }),
    };
    pb::RuntimeEvent { event: Some(event) }
}

fn failed_to_pb(error: RuntimeError) -> pb::RuntimeEvent {
    pb::RuntimeEvent {
        event: Some(pb::runtime_event::Event::Failed(pb::Failed {
            kind: kind_to_pb(error.kind) as i32,
            message: error.message,
            retryable: error.retryable,
        })),
    }
}

fn kind_from_pb(kind: pb::ErrorKind) -> ErrorKind {
    match kind {
        pb::ErrorKind::RateLimit => ErrorKind::RateLimit,
        pb::ErrorKind::ContextLength => ErrorKind::ContextLength,
        pb::ErrorKind::Timeout => ErrorKind::Timeout,
        pb::ErrorKind::Refusal => ErrorKind::Refusal,
        pb::ErrorKind::Unknown | pb::ErrorKind::Unspecified => ErrorKind::Unknown,
    }
}

fn kind_to_pb(kind: ErrorKind) -> pb::ErrorKind {
    match kind {
        ErrorKind::RateLimit => pb::ErrorKind::RateLimit,
        ErrorKind::ContextLength => pb::ErrorKind::ContextLength,
        ErrorKind::Timeout => pb::ErrorKind::Timeout,
        ErrorKind::Refusal => pb::ErrorKind::Refusal,
        ErrorKind::Unknown => pb::ErrorKind::Unknown,
    }
}

/// Exposes `runtime` as the gRPC `AgentRuntime` service.
pub fn serve_runtime<R: AgentRuntime + ?Sized>(
    runtime: Arc<R>,
) -> AgentRuntimeServer<RuntimeService<R>> {
    AgentRuntimeServer::new(RuntimeService::new(runtime))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The gRPC `AgentRuntime` service over a Rust [`AgentRuntime`].
///
/// Every running execution has a cancellation token in a map by run id:
/// `Cancel` fires it, and so does the client going away (the response stream
/// being dropped before it ended). Events are forwarded as the runtime
/// produces them; an `Err` becomes a final `failed` event.
pub struct RuntimeService<R: ?Sized> {
    runtime: Arc<R>,
    runs: Arc<Mutex<HashMap<String, Running>>>,
    next_generation: AtomicU64,
}

struct Running {
    /// Tells this execution apart from a later one with the same run id.
    generation: u64,
    cancel: CancellationToken,
}

impl<R: AgentRuntime + ?Sized> RuntimeService<R> {
    pub fn new(runtime: Arc<R>) -> Self {
        Self {
            runtime,
            runs: Arc::default(),
            next_generation: AtomicU64::new(0),
        }
    }

    fn register(&self, run_id: &str) -> RunGuard {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let cancel = CancellationToken::new();
        let previous = lock(&self.runs).insert(
            run_id.to_owned(),
            Running {
                generation,
                cancel: cancel.clone(),
            },
        );
        if let Some(previous) = previous {
            // A new call for the same run replaces the old one (its client is
            // presumably gone, e.g. a retry that raced the reset).
            tracing::warn!(%run_id, "run executed again while running; cancelling the earlier execution");
            previous.cancel.cancel();
        }
        RunGuard {
            runs: self.runs.clone(),
            run_id: run_id.to_owned(),
            generation,
            cancel,
            completed: false,
        }
    }
}

fn lock(
    runs: &Mutex<HashMap<String, Running>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    runs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Unregisters an execution when its response stream (or the handler, if
/// the client left before the stream started) is dropped, cancelling it
/// unless it ran to the end.
struct RunGuard {
    runs: Arc<Mutex<HashMap<String, Running>>>,
    run_id: String,
    generation: u64,
    cancel: CancellationToken,
    completed: bool,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if !self.completed {
            self.cancel.cancel();
        }
        let mut runs = lock(&self.runs);
        if runs
            .get(&self.run_id)
            .is_some_and(|r| r.generation == self.generation)
        {
            runs.remove(&self.run_id);
        }
    }
}

/// Forwards one execution's events; ends after `finished` or `failed`.
struct Forward {
    events: Option<RuntimeStream>,
    guard: RunGuard,
}

impl Forward {
    async fn next(mut self) -> Option<(Result<pb::RuntimeEvent, Status>, Self)> {
        let Some(item) = self.events.as_mut()?.next().await else {
            self.guard.completed = true;
            return None;
        };
        let event = match item {
            Ok(event) => {
                if matches!(event, RuntimeEvent::Finished { .. }) {
                    self.finish();
                }
                event_to_pb(event)
            }
            Err(error) => {
                self.finish();
                failed_to_pb(error)
            }
        };
        Some((Ok(event), self))
    }

    fn finish(&mut self) {
        self.events = None;
        self.guard.completed = true;
    }
}

#[async_trait]
impl<R: AgentRuntime + ?Sized> agent_runtime_server::AgentRuntime for RuntimeService<R> {
    type ExecuteStream = BoxStream<'static, Result<pb::RuntimeEvent, Status>>;

    async fn execute(
        &self,
        request: tonic::Request<pb::ExecuteRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStream>, Status> {
        let request = request_from_pb(request.into_inner())?;
        // Registered before `execute` so a client that leaves while the
        // runtime is starting still cancels it.
        let mut guard = self.register(&request.run_id);
        let stream = match self.runtime.execute(request, guard.cancel.clone()).await {
            Ok(events) => futures::stream::unfold(
                Forward {
                    events: Some(events),
                    guard,
                },
                Forward::next,
            )
            .fuse()
            .boxed(),
            Err(error) => {
                guard.completed = true;
                drop(guard);
                futures::stream::once(std::future::ready(Ok(failed_to_pb(error)))).boxed()
            }
        };
        Ok(tonic::Response::new(stream))
    }

    async fn list_models(
        &self,
        _request: tonic::Request<pb::ListModelsRequest>,
    ) -> Result<tonic::Response<pb::ListModelsResponse>, Status> {
        let catalog = self
            .runtime
            .models()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(tonic::Response::new(catalog_to_pb(catalog)))
    }

    async fn cancel(
        &self,
        request: tonic::Request<pb::CancelRequest>,
    ) -> Result<tonic::Response<pb::CancelResponse>, Status> {
        let run_id = request.into_inner().run_id;
        let cancelled = match lock(&self.runs).get(&run_id) {
            Some(running) if !running.cancel.is_cancelled() => {
                running.cancel.cancel();
                true
            }
            _ => false,
        };
        tracing::debug!(%run_id, cancelled, "cancel requested");
        Ok(tonic::Response::new(pb::CancelResponse { cancelled }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_kinds() {
        let cases = [
            (Code::Unavailable, ErrorKind::Unknown, true),
            (Code::DeadlineExceeded, ErrorKind::Timeout, true),
            (Code::ResourceExhausted, ErrorKind::RateLimit, true),
            (Code::Internal, ErrorKind::Unknown, false),
            (Code::InvalidArgument, ErrorKind::Unknown, false),
            (Code::Cancelled, ErrorKind::Unknown, false),
        ];
        for (code, kind, retryable) in cases {
            let error = status_to_error("http://x", &Status::new(code, "boom"));
            assert_eq!((error.kind, error.retryable), (kind, retryable), "{code:?}");
            assert!(error.message.contains("boom"), "{}", error.message);
        }
    }

    #[test]
    fn events_round_trip() {
        let events = [
            RuntimeEvent::AssistantDelta("hi".into()),
            RuntimeEvent::ToolStart {
                tool_call_id: "t".into(),
                name: "n".into(),
                arguments_json: "{}".into(),
            },
            RuntimeEvent::ToolUpdate {
                tool_call_id: "t".into(),
                partial_json: "{\"a\"".into(),
            },
            RuntimeEvent::ToolResult {
                tool_call_id: "t".into(),
                result_json: "1".into(),
                is_error: true,
            },
            RuntimeEvent::Usage(Usage {
                input_tokens: 1,
                output_tokens: 2,
                total_tokens: 3,
            }),
            RuntimeEvent::Finished {
                stop_reason: "length".into(),
            },
        ];
        for event in events {
            assert_eq!(event_from_pb(event_to_pb(event.clone())), Some(Ok(event)));
        }
        for kind in [
            ErrorKind::RateLimit,
            ErrorKind::ContextLength,
            ErrorKind::Timeout,
            ErrorKind::Refusal,
            ErrorKind::Unknown,
        ] {
            let error = RuntimeError::new(kind, "m", true);
            assert_eq!(event_from_pb(failed_to_pb(error.clone())), Some(Err(error)));
        }
        assert_eq!(event_from_pb(pb::RuntimeEvent { event: None }), None);
    }

    #[test]
    fn requests_round_trip() {
        let request = RuntimeRequest {
            run_id: "r".into(),
            session_key: "k".into(),
            session_id: "s".into(),
            message: "m".into(),
            history: vec![HistoryMessage {
                role: "user".into(),
                content_json: "[]".into(),
            }],
            options: serde_json::json!({"a": 1}),
            deadline_ms: Some(5),
        };
        let back = request_from_pb(request_to_pb(request.clone())).unwrap();
        assert_eq!(back.history, request.history);
        assert_eq!(back.options, request.options);
        assert_eq!(back.deadline_ms, Some(5));

        let mut bare = request_to_pb(RuntimeRequest {
            options: serde_json::Value::Null,
            deadline_ms: None,
            ..request
        });
        assert_eq!((bare.options_json.as_str(), bare.deadline_ms), ("{}", 0));
        bare.options_json.clear();
        let back = request_from_pb(bare.clone()).unwrap();
        assert_eq!(
            (back.options, back.deadline_ms),
            (serde_json::json!({}), None)
        );
        bare.options_json = "{".into();
        assert_eq!(
            request_from_pb(bare).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}

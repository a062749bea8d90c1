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

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_proto::agent_runtime::v1 as pb;
use clawgate_proto::agent_runtime::v1::agent_runtime_client::AgentRuntimeClient;
use clawgate_telemetry::tls::ClientTls;
use clawgate_telemetry::tls::client::lazy_channel;
use clawgate_telemetry::{TracedChannel, traced_channel};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tonic::{Code, Status, Streaming};

mod convert;
mod service;

pub use convert::catalog_to_pb;
use convert::{catalog_from_pb, event_from_pb, request_to_pb};
pub use service::{RuntimeService, serve_runtime};

use super::{
    AgentRuntime, ErrorKind, Inputs, ModelCatalog, RuntimeError, RuntimeEvent, RuntimeRequest,
    RuntimeStream,
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
    /// How an `https://` runtime is reached (CAs, client certificate);
    /// none: the Mozilla roots and no client certificate.
    pub tls: Option<ClientTls>,
}

impl Default for GrpcRuntimeConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            tls: None,
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
    /// Prepares a channel to `address` (`http://host:port`, or
    /// `https://host:port` over TLS with `config.tls`; a bare `host:port`
    /// gets `http://`). The connection is made lazily, on the
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
        let channel = traced_channel(lazy_channel(&endpoint, config.tls.as_ref()), endpoint.uri());
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
        tokio::spawn(forward_inputs(
            self.client.clone(),
            run_id.clone(),
            request.inputs.clone(),
            stop.clone(),
        ));

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
/// Offers each message steered into the run to the runtime (`Steer`) until
/// the run stops taking them. One the runtime refuses is simply not taken:
/// the coordinator makes it the next turn when the run ends.
async fn forward_inputs(
    mut client: AgentRuntimeClient<TracedChannel>,
    run_id: String,
    inputs: Inputs,
    stop: CancellationToken,
) {
    loop {
        let more = tokio::select! {
            more = inputs.wait() => more,
            () = stop.cancelled() => return,
        };
        if !more {
            return;
        }
        while let Some(input) = inputs.try_take() {
            let mut call = tonic::Request::new(pb::SteerRequest {
                run_id: run_id.clone(),
                input_id: input.id,
                message: input.message,
            });
            call.set_timeout(CANCEL_TIMEOUT);
            match client.steer(call).await {
                Ok(response) if response.get_ref().accepted => {}
                Ok(_) => tracing::debug!(%run_id, "the runtime did not accept a steered message"),
                // A runtime without `Steer` takes no steered messages.
                Err(status) if status.code() == Code::Unimplemented => return,
                Err(status) => tracing::debug!(%run_id, error = %status, "steering failed"),
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::convert::{event_to_pb, failed_to_pb, request_from_pb};
    use super::*;
    use crate::runtime::{HistoryMessage, Usage};

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
            inputs: Default::default(),
            attachments: Vec::new(),
        };
        let back = request_from_pb(request_to_pb(request.clone()), Inputs::default()).unwrap();
        assert_eq!(back.history, request.history);
        assert_eq!(back.options, request.options);
        assert_eq!(back.deadline_ms, Some(5));

        let mut bare = request_to_pb(RuntimeRequest {
            options: serde_json::Value::Null,
            deadline_ms: None,
            inputs: Default::default(),
            attachments: Vec::new(),
            ..request
        });
        assert_eq!((bare.options_json.as_str(), bare.deadline_ms), ("{}", 0));
        bare.options_json.clear();
        let back = request_from_pb(bare.clone(), Inputs::default()).unwrap();
        assert_eq!(
            (back.options, back.deadline_ms),
            (serde_json::json!({}), None)
        );
        bare.options_json = "{".into();
        assert_eq!(
            request_from_pb(bare, Inputs::default()).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}

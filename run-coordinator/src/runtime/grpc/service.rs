//! The gRPC `AgentRuntime` service over a Rust [`AgentRuntime`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawgate_proto::agent_runtime::v1 as pb;
use clawgate_proto::agent_runtime::v1::agent_runtime_server::{self, AgentRuntimeServer};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::MAX_MESSAGE_BYTES;
use super::convert::{catalog_to_pb, event_to_pb, failed_to_pb, request_from_pb};
use crate::runtime::{AgentRuntime, Inputs, RuntimeEvent, RuntimeStream};

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
    /// Where `Steer` puts messages for it.
    inputs: Inputs,
}

impl<R: AgentRuntime + ?Sized> RuntimeService<R> {
    pub fn new(runtime: Arc<R>) -> Self {
        Self {
            runtime,
            runs: Arc::default(),
            next_generation: AtomicU64::new(0),
        }
    }

    fn register(&self, run_id: &str, inputs: Inputs) -> RunGuard {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let cancel = CancellationToken::new();
        let previous = lock(&self.runs).insert(
            run_id.to_owned(),
            Running {
                generation,
                cancel: cancel.clone(),
                inputs,
            },
        );
        if let Some(previous) = previous {
            // A new call for the same run replaces the old one (its client is
            // presumably gone, e.g. a retry that raced the reset).
            clawgate_telemetry::limited!(warn, %run_id, "run executed again while running; cancelling the earlier execution");
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
        let inputs = Inputs::default();
        let request = request_from_pb(request.into_inner(), inputs.clone())?;
        // Registered before `execute` so a client that leaves while the
        // runtime is starting still cancels it.
        let mut guard = self.register(&request.run_id, inputs);
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

    async fn steer(
        &self,
        request: tonic::Request<pb::SteerRequest>,
    ) -> Result<tonic::Response<pb::SteerResponse>, Status> {
        let request = request.into_inner();
        let accepted = match lock(&self.runs).get(&request.run_id) {
            Some(running) if !running.cancel.is_cancelled() => {
                running.inputs.push(crate::runtime::SteerInput {
                    id: request.input_id,
                    message: request.message,
                })
            }
            _ => false,
        };
        Ok(tonic::Response::new(pb::SteerResponse { accepted }))
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

//! A real agent runtime service (clawgate.agent_runtime.v1 over gRPC, on
//! loopback port 0) that counts how many times each run was executed: what
//! a test needs to show that no run executed twice, across coordinator
//! processes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::agent_runtime::v1 as pb;
use clawgate_proto::agent_runtime::v1::agent_runtime_server::{AgentRuntime, AgentRuntimeServer};
use clawgate_telemetry::tls::{ServerTls, incoming};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Replies "echo: <message>" after `delay`, and counts executions per run.
pub struct CountingRuntime {
    pub address: SocketAddr,
    executions: Arc<Mutex<HashMap<String, u32>>>,
    stop: CancellationToken,
    scheme: &'static str,
}

#[derive(Clone)]
struct Service {
    executions: Arc<Mutex<HashMap<String, u32>>>,
    delay: Duration,
}

#[tonic::async_trait]
impl AgentRuntime for Service {
    type ExecuteStream = BoxStream<'static, Result<pb::RuntimeEvent, tonic::Status>>;

    async fn execute(
        &self,
        request: tonic::Request<pb::ExecuteRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStream>, tonic::Status> {
        let request = request.into_inner();
        *self
            .executions
            .lock()
            .unwrap()
            .entry(request.run_id.clone())
            .or_default() += 1;
        let delay = self.delay;
        let reply = format!("echo: {}", request.message);
        let events = [
            pb::runtime_event::Event::AssistantDelta(pb::AssistantDelta { text: reply }),
            pb::runtime_event::Event::Finished(pb::Finished {
                stop_reason: "stop".into(),
            }),
        ];
        let stream = futures::stream::iter(events)
            .enumerate()
            .then(move |(i, event)| async move {
                if i == 0 {
                    tokio::time::sleep(delay).await;
                }
                Ok(pb::RuntimeEvent { event: Some(event) })
            });
        Ok(tonic::Response::new(stream.boxed()))
    }

    async fn cancel(
        &self,
        _request: tonic::Request<pb::CancelRequest>,
    ) -> Result<tonic::Response<pb::CancelResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::CancelResponse { cancelled: true }))
    }

    /// It takes no steered messages: they become turns of their own.
    async fn steer(
        &self,
        _request: tonic::Request<pb::SteerRequest>,
    ) -> Result<tonic::Response<pb::SteerResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::SteerResponse { accepted: false }))
    }

    /// As a runtime written against the contract before `ListModels`
    /// existed answers: the coordinator then offers no model by name.
    async fn list_models(
        &self,
        _request: tonic::Request<pb::ListModelsRequest>,
    ) -> Result<tonic::Response<pb::ListModelsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("ListModels"))
    }
}

impl CountingRuntime {
    pub async fn start(delay: Duration) -> Self {
        Self::start_with(delay, None).await
    }

    /// Serving over TLS (mutual TLS when `tls` requires client
    /// certificates): its [`url`](Self::url) is `https://`.
    pub async fn start_tls(delay: Duration, tls: ServerTls) -> Self {
        Self::start_with(delay, Some(tls)).await
    }

    async fn start_with(delay: Duration, tls: Option<ServerTls>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let executions = Arc::new(Mutex::new(HashMap::new()));
        let service = Service {
            executions: executions.clone(),
            delay,
        };
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentRuntimeServer::new(service))
                .serve_with_incoming_shutdown(
                    incoming(listener, tls.as_ref()),
                    until.cancelled_owned(),
                ),
        );
        Self {
            address,
            executions,
            stop,
            scheme: if tls.is_some() { "https" } else { "http" },
        }
    }

    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.address)
    }

    /// How many times each run was executed so far.
    pub fn executions(&self) -> HashMap<String, u32> {
        self.executions.lock().unwrap().clone()
    }
}

impl Drop for CountingRuntime {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

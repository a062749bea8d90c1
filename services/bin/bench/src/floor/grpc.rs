//! The two gRPC hops of floors (b) and (c): service A answers
//! `RunCoordinator/Submit` by calling service B's `SessionStore/CreateRun`,
//! which answers at once (b) or after committing the record durably (c,
//! `commit`). Each serves that one method (every other is UNIMPLEMENTED)
//! with the generated messages, so sizes are the real ones.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use clawgate_common::clock::now_ms;
use clawgate_proto::run_coordinator::v1 as rc;
use clawgate_proto::session_store::v1 as ss;
use prost::Message;
use serde_json::json;
use tokio::net::TcpListener;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};

use super::commit::Committer;

/// One unary gRPC method and its handler.
pub trait Unary: Clone + Send + Sync + 'static {
    /// The service's full name (`package.Service`).
    const SERVICE: &'static str;
    /// The path of the one method served.
    const PATH: &'static str;
    type Request: prost::Message + Default + Send + 'static;
    type Response: prost::Message + Send + 'static;

    fn handle(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, tonic::Status>> + Send;
}

/// A tonic service serving `U`'s method, as generated code routes it.
#[derive(Clone)]
pub struct OneMethod<U>(pub U);

impl<U: Unary> NamedService for OneMethod<U> {
    const NAME: &'static str = U::SERVICE;
}

struct Handler<U>(U);

impl<U: Unary> UnaryService<U::Request> for Handler<U> {
    type Response = U::Response;
    type Future = BoxFuture<tonic::Response<U::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<U::Request>) -> Self::Future {
        let unary = self.0.clone();
        Box::pin(async move {
            unary
                .handle(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<U: Unary, B> Service<http::Request<B>> for OneMethod<U>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != U::PATH {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let handler = Handler(self.0.clone());
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(handler, request).await)
        })
    }
}

/// Serves `unary` on `listener` (Nagle off, as the services do) until the
/// runtime stops.
pub async fn serve<U: Unary>(unary: U, listener: TcpListener) -> anyhow::Result<()> {
    Server::builder()
        .add_service(OneMethod(unary))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await?;
    Ok(())
}

/// A lazily connecting channel to `address`, Nagle off (as the edge's).
pub fn channel(address: std::net::SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .tcp_nodelay(true)
        .connect_lazy())
}

/// The coordinator's hold on every partition, as the tokens its writes
/// carry: the epoch of each partition.
#[derive(Debug)]
pub struct Ownership {
    pub member: String,
    pub epochs: Vec<u64>,
}

impl Ownership {
    fn token(&self, session_key: &str) -> ss::OwnerToken {
        let partition =
            clawgate_common::partition::partition_of(session_key, self.epochs.len() as u32);
        ss::OwnerToken {
            partition,
            member: self.member.clone(),
            epoch: self.epochs[partition as usize],
        }
    }
}

/// Service A: `Submit` → B's `CreateRun`, as admission does.
#[derive(Clone)]
pub struct Submitter {
    pub store: ss::session_store_client::SessionStoreClient<Channel>,
    pub ownership: Arc<Ownership>,
}

impl Unary for Submitter {
    const SERVICE: &'static str = "clawgate.run_coordinator.v1.RunCoordinator";
    const PATH: &'static str = "/clawgate.run_coordinator.v1.RunCoordinator/Submit";
    type Request = rc::SubmitRequest;
    type Response = rc::SubmitResponse;

    async fn handle(&self, submit: rc::SubmitRequest) -> Result<rc::SubmitResponse, tonic::Status> {
        let options: serde_json::Value =
            serde_json::from_str(&submit.options_json).unwrap_or_else(|_| json!({}));
        let spec = json!({
            "kind": submit.kind, "message": submit.message, "queue_mode": "enqueue",
            "timeout_ms": (submit.timeout_ms > 0).then_some(submit.timeout_ms),
            "options": options, "requester": submit.requester, "label": submit.label,
        });
        // A SHA-256 in hex, as admission's fingerprint.
        let fingerprint = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let create = ss::CreateRunRequest {
            run_id: submit.run_id.clone(),
            session_key: submit.session_key.clone(),
            kind: submit.kind.clone(),
            fingerprint,
            status: ss::RunStatus::Queued as i32,
            owner: self.ownership.member.clone(),
            request_json: spec.to_string(),
            owner_token: Some(self.ownership.token(&submit.session_key)),
            // The floor's sessions have no settings to check.
            expected_settings_digest: None,
            create_session: false,
        };
        let created = self.store.clone().create_run(create).await?.into_inner();
        let record = created.record.unwrap_or_default();
        Ok(rc::SubmitResponse {
            admission: rc::Admission::Accepted as i32,
            snapshot: Some(rc::RunSnapshot {
                run_id: submit.run_id,
                session_key: submit.session_key,
                kind: submit.kind,
                status: ss::RunStatus::Queued as i32,
                created_at_ms: record.created_at_ms,
                epoch: self.ownership.member.clone(),
                requester: submit.requester,
                ..rc::RunSnapshot::default()
            }),
            accepted_at_ms: record.created_at_ms,
        })
    }
}

/// Service B: `CreateRun`, answered at once or after the commit.
#[derive(Clone)]
pub struct Recorder {
    /// (c): where the record is committed.
    pub committer: Option<Arc<Committer>>,
}

impl Unary for Recorder {
    const SERVICE: &'static str = "clawgate.session_store.v1.SessionStore";
    const PATH: &'static str = "/clawgate.session_store.v1.SessionStore/CreateRun";
    type Request = ss::CreateRunRequest;
    type Response = ss::CreateRunResponse;

    async fn handle(
        &self,
        create: ss::CreateRunRequest,
    ) -> Result<ss::CreateRunResponse, tonic::Status> {
        let now = now_ms();
        let record = ss::RunRecord {
            run_id: create.run_id,
            session_key: create.session_key,
            kind: create.kind,
            fingerprint: create.fingerprint,
            status: create.status,
            owner: create.owner,
            version: 1,
            created_at_ms: now,
            updated_at_ms: now,
            request_json: create.request_json,
            ..ss::RunRecord::default()
        };
        let created = match &self.committer {
            None => true,
            Some(committer) => committer
                .create(record.run_id.clone(), record.encode_to_vec())
                .await
                .map_err(|e| tonic::Status::unavailable(format!("{e:#}")))?,
        };
        Ok(ss::CreateRunResponse {
            created,
            record: Some(record),
            fingerprint_mismatch: false,
        })
    }
}

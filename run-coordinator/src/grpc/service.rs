//! The tonic adapter of the coordinator: decode, call, encode. No logic here.

use std::pin::Pin;
use std::time::Duration;

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_server::RunCoordinator as GrpcRunCoordinator;
use futures::Stream;
use futures::StreamExt;
use session_store_api::SessionKey;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use run_coordinator_api::error::CoordinatorError;
use run_coordinator_api::events::{StreamItem, StreamReset};
use run_coordinator_api::grpc::convert::*;
use run_coordinator_api::grpc::status::to_status;
use run_coordinator_api::model::{CancelTarget, RuntimeInfo};

use super::scope::{Bound, check_run};
use crate::coordinator::Coordinator;

pub struct RunCoordinatorService {
    coordinator: Coordinator,
    /// Fires when the server stops: open subscriptions end and waits answer
    /// with the current snapshot, so that shutdown is not held up by them.
    stopping: CancellationToken,
}

impl RunCoordinatorService {
    pub fn new(coordinator: Coordinator, stopping: CancellationToken) -> Self {
        Self {
            coordinator,
            stopping,
        }
    }
}

type GrpcResult<T> = Result<Response<T>, Status>;
type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SubscribeResponse, Status>> + Send>>;

fn reset_item(reset: StreamReset) -> pb::SubscribeResponse {
    stream_item_to_pb(&StreamItem::Reset(reset))
}

fn event_item(event: &run_coordinator_api::events::RunEvent) -> pb::SubscribeResponse {
    pb::SubscribeResponse {
        item: Some(pb::subscribe_response::Item::Event(event_to_pb(event))),
    }
}

fn just_reset(reset: StreamReset) -> EventStream {
    Box::pin(futures::stream::iter([Ok(reset_item(reset))]))
}

impl RunCoordinatorService {
    /// A coordinator that owns no partition (a standby, or one whose tenure
    /// ended) answers every call with UNAVAILABLE, NOT_OWNER and the leader's
    /// address when known: its memory holds no live run a caller could mean.
    fn owner(&self) -> Result<(), Status> {
        let ownership = self.coordinator.ownership();
        match ownership.is_serving() {
            true => Ok(()),
            false => Err(to_status(ownership.not_serving())),
        }
    }
}

#[tonic::async_trait]
impl GrpcRunCoordinator for RunCoordinatorService {
    async fn submit(&self, request: Request<pb::SubmitRequest>) -> GrpcResult<pb::SubmitResponse> {
        self.owner()?;
        let bound = Bound::of(&request);
        let submit = submit_from_pb(request.into_inner()).map_err(to_status)?;
        let done = match bound {
            Some(bound) => {
                bound.check_session(&submit.session_key)?;
                let run_id = submit.run_id.clone();
                bound.screen_submit(self.coordinator.submit(submit).await, &run_id)?
            }
            None => self.coordinator.submit(submit).await.map_err(to_status)?,
        };
        Ok(Response::new(submitted_to_pb(done)))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> GrpcResult<pb::GetResponse> {
        self.owner()?;
        check_run(&request, &self.coordinator, &request.get_ref().run_id).await?;
        let snapshot = self
            .coordinator
            .get(&request.into_inner().run_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::GetResponse {
            snapshot: snapshot.map(snapshot_to_pb),
        }))
    }

    async fn wait(&self, request: Request<pb::WaitRequest>) -> GrpcResult<pb::WaitResponse> {
        self.owner()?;
        check_run(&request, &self.coordinator, &request.get_ref().run_id).await?;
        let req = request.into_inner();
        let config = &self.coordinator.inner.config;
        let timeout = match req.timeout_ms {
            0 => config.default_wait,
            ms => Duration::from_millis(ms).min(config.max_wait),
        };
        let waited = tokio::select! {
            waited = self.coordinator.wait(&req.run_id, timeout) => waited,
            () = self.stopping.cancelled() => self.coordinator.wait(&req.run_id, Duration::ZERO).await,
        }
        .map_err(to_status)?;
        Ok(Response::new(wait_to_pb(waited)))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> GrpcResult<pb::CancelResponse> {
        self.owner()?;
        let bound = Bound::of(&request);
        let target = cancel_target_from_pb(request.into_inner().target).map_err(to_status)?;
        match (&bound, &target) {
            (Some(bound), CancelTarget::Run(run_id)) => {
                bound.check_run(&self.coordinator, run_id).await?;
            }
            (Some(bound), CancelTarget::Session(key)) => bound.check_session(key)?,
            (None, _) => {}
        }
        let runs = self.coordinator.cancel(target).await.map_err(to_status)?;
        Ok(Response::new(pb::CancelResponse {
            runs: runs.into_iter().map(snapshot_to_pb).collect(),
        }))
    }

    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> GrpcResult<Self::SubscribeStream> {
        self.owner()?;
        let bound = Bound::of(&request);
        let req = request.into_inner();
        match (&bound, &req.filter) {
            (Some(bound), Some(pb::subscribe_request::Filter::RunId(run_id))) => {
                bound.check_run(&self.coordinator, run_id).await?;
            }
            (Some(bound), Some(pb::subscribe_request::Filter::All(_))) => {
                return Err(bound.refuse_all());
            }
            _ => {}
        }
        let epoch = Some(req.epoch.as_str()).filter(|e| !e.is_empty());
        let subscribed = StreamItem::Subscribed {
            epoch: self.coordinator.epoch().to_owned(),
        };
        let subscribed =
            futures::stream::once(std::future::ready(Ok(stream_item_to_pb(&subscribed))));
        let stream: EventStream = match req.filter {
            Some(pb::subscribe_request::Filter::RunId(run_id)) => {
                match self.coordinator.subscribe_run(&run_id, req.from_seq, epoch) {
                    Err(reset) => just_reset(reset),
                    Ok(subscription) => Box::pin(subscribed.chain(futures::stream::unfold(
                        Some(subscription),
                        |subscription| async move {
                            let mut subscription = subscription?;
                            match subscription.next().await? {
                                Ok(event) => Some((Ok(event_item(&event)), Some(subscription))),
                                Err(reset) => Some((Ok(reset_item(reset)), None)),
                            }
                        },
                    ))),
                }
            }
            Some(pb::subscribe_request::Filter::All(_)) => {
                match self.coordinator.subscribe_all(req.from_seq, epoch) {
                    Err(reset) => just_reset(reset),
                    Ok(subscription) => Box::pin(subscribed.chain(futures::stream::unfold(
                        Some(subscription),
                        |subscription| async move {
                            let mut subscription = subscription?;
                            match subscription.next().await {
                                Ok(event) => Some((Ok(event_item(&event)), Some(subscription))),
                                Err(reset) => Some((Ok(reset_item(reset)), None)),
                            }
                        },
                    ))),
                }
            }
            None => {
                return Err(to_status(CoordinatorError::invalid(
                    "subscribe needs a run_id or all",
                )));
            }
        };
        Ok(Response::new(Box::pin(
            stream.take_until(self.stopping.clone().cancelled_owned()),
        )))
    }

    async fn list_active(
        &self,
        request: Request<pb::ListActiveRequest>,
    ) -> GrpcResult<pb::ListActiveResponse> {
        self.owner()?;
        let session = match request.into_inner().session_key {
            Some(key) => Some(SessionKey::parse(&key).map_err(|e| to_status(e.into()))?),
            None => None,
        };
        let runs = self.coordinator.list_active(session.as_ref());
        Ok(Response::new(pb::ListActiveResponse {
            runs: runs.into_iter().map(snapshot_to_pb).collect(),
        }))
    }

    async fn describe_lanes(
        &self,
        _request: Request<pb::DescribeLanesRequest>,
    ) -> GrpcResult<pb::DescribeLanesResponse> {
        Ok(Response::new(lanes_to_pb(self.coordinator.lane_stats())))
    }

    async fn describe_runtime(
        &self,
        _request: Request<pb::DescribeRuntimeRequest>,
    ) -> GrpcResult<pb::DescribeRuntimeResponse> {
        let runtime = self.coordinator.runtime();
        let catalog = runtime
            .models()
            .await
            .map_err(|e| Status::unavailable(format!("agent runtime: {e}")))?;
        Ok(Response::new(runtime_to_pb(RuntimeInfo {
            name: runtime.name().to_owned(),
            catalog,
        })))
    }
}

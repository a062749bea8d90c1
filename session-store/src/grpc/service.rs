//! The tonic adapter: decode, call the domain store, encode. No logic here.

use std::sync::Arc;
use std::time::Duration;

use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::session_store::v1::session_store_server::SessionStore as GrpcSessionStore;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::convert::*;
use super::status::to_status;
use crate::key::SessionKey;
use crate::model::{DeleteOutcome, ListQuery, ResetOutcome};
use crate::store::SessionStore;
use clawgate_common::clock::now_ms;
use clawgate_telemetry::CallerIdentity;

pub struct SessionStoreService {
    store: Arc<dyn SessionStore>,
    stopping: CancellationToken,
}

impl SessionStoreService {
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        Self {
            store,
            stopping: CancellationToken::new(),
        }
    }

    /// Open WatchLeases streams end when `stopping` fires (server shutdown).
    pub fn with_stopping(mut self, stopping: CancellationToken) -> Self {
        self.stopping = stopping;
        self
    }
}

type GrpcResult<T> = Result<Response<T>, Status>;

/// How often WatchLeases reads the table when the caller asks for 0, and the
/// bounds it keeps a caller's interval within.
const WATCH_DEFAULT_INTERVAL_MS: u32 = 1000;
const WATCH_MIN_INTERVAL_MS: u32 = 100;
const WATCH_MAX_INTERVAL_MS: u32 = 60_000;
/// Intervals without a change after which a watch sends the table anyway,
/// so that its watcher can tell a quiet table from a silent stream.
const WATCH_KEEPALIVE_INTERVALS: u32 = 10;

fn key(raw: &str) -> Result<SessionKey, Status> {
    SessionKey::parse(raw).map_err(|e| to_status(e.into()))
}

fn reset_to_pb(out: ResetOutcome) -> pb::ResetSessionResponse {
    pb::ResetSessionResponse {
        session: Some(session_to_pb(out.session)),
        previous_session_id: out.previous_session_id.map(|id| id.to_string()),
        superseded_run_id: out.superseded_run_id,
    }
}

fn delete_to_pb(out: DeleteOutcome) -> pb::DeleteSessionResponse {
    pb::DeleteSessionResponse {
        deleted: out.deleted,
        previous_session_id: out.previous_session_id.map(|id| id.to_string()),
        superseded_run_id: out.superseded_run_id,
    }
}

#[tonic::async_trait]
impl GrpcSessionStore for SessionStoreService {
    async fn acquire_writer(
        &self,
        request: Request<pb::AcquireWriterRequest>,
    ) -> GrpcResult<pb::AcquireWriterResponse> {
        let req = acquire_from_pb(request.into_inner()).map_err(to_status)?;
        let got = self.store.acquire_writer(req).await.map_err(to_status)?;
        Ok(Response::new(acquired_to_pb(got)))
    }

    async fn release_writer(
        &self,
        request: Request<pb::ReleaseWriterRequest>,
    ) -> GrpcResult<pb::ReleaseWriterResponse> {
        let req = request.into_inner();
        let out = self
            .store
            .release_writer(
                &key(&req.session_key)?,
                &req.run_id,
                req.fence_token,
                req.owner_token.map(owner_token_from_pb).as_ref(),
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::ReleaseWriterResponse {
            released: out.released,
            session: out.session.map(session_to_pb),
        }))
    }

    async fn append(&self, request: Request<pb::AppendRequest>) -> GrpcResult<pb::AppendResponse> {
        let req = request.into_inner();
        let append = crate::model::AppendEntries {
            key: key(&req.session_key)?,
            session_id: crate::model::parse_session_id(&req.session_id)
                .map_err(|e| to_status(e.into()))?,
            run_id: req.run_id,
            fence_token: req.fence_token,
            entries: req.entries.into_iter().map(new_entry_from_pb).collect(),
            owner_token: req.owner_token.map(owner_token_from_pb),
        };
        let out = self.store.append(append).await.map_err(to_status)?;
        Ok(Response::new(pb::AppendResponse {
            first_seq: out.first_seq,
            last_seq: out.last_seq,
            session: Some(session_to_pb(out.session)),
        }))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> GrpcResult<pb::HistoryResponse> {
        let query = history_from_pb(request.into_inner()).map_err(to_status)?;
        let session_key = query.key.as_str().to_owned();
        let page = self.store.history(query).await.map_err(to_status)?;
        Ok(Response::new(pb::HistoryResponse {
            session_key,
            session_id: page.session_id.map(|id| id.to_string()).unwrap_or_default(),
            entries: page.entries.into_iter().map(entry_to_pb).collect(),
            has_more: page.has_more,
            total: page.total,
        }))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> GrpcResult<pb::GetSessionResponse> {
        let session = self
            .store
            .get_session(&key(&request.into_inner().session_key)?)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::GetSessionResponse {
            session: session.map(session_to_pb),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> GrpcResult<pb::ListSessionsResponse> {
        let req = request.into_inner();
        if req.active_minutes == Some(0) {
            return Err(to_status(crate::StoreError::invalid(
                "active_minutes must be at least 1",
            )));
        }
        let query = ListQuery {
            limit: req.limit,
            updated_since_ms: req
                .active_minutes
                .map(|minutes| now_ms() - i64::from(minutes) * 60_000)
                .max(req.updated_since_ms),
            search: req.search.filter(|s| !s.is_empty()),
        };
        let sessions = self.store.list_sessions(query).await.map_err(to_status)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(session_to_pb).collect(),
        }))
    }

    async fn reset_session(
        &self,
        request: Request<pb::ResetSessionRequest>,
    ) -> GrpcResult<pb::ResetSessionResponse> {
        let k = key(&request.into_inner().session_key)?;
        let out = self.store.reset_session(&k).await.map_err(to_status)?;
        Ok(Response::new(reset_to_pb(out)))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> GrpcResult<pb::DeleteSessionResponse> {
        let req = request.into_inner();
        let out = self
            .store
            .delete_session(&key(&req.session_key)?, req.delete_transcript)
            .await
            .map_err(to_status)?;
        Ok(Response::new(delete_to_pb(out)))
    }

    async fn patch_session(
        &self,
        request: Request<pb::PatchSessionRequest>,
    ) -> GrpcResult<pb::PatchSessionResponse> {
        let req = patch_from_pb(request.into_inner()).map_err(to_status)?;
        let out = self.store.patch_session(req).await.map_err(to_status)?;
        Ok(Response::new(pb::PatchSessionResponse {
            session: Some(session_to_pb(out.session)),
            created: out.created,
        }))
    }

    async fn create_run(
        &self,
        request: Request<pb::CreateRunRequest>,
    ) -> GrpcResult<pb::CreateRunResponse> {
        let new = new_run_from_pb(request.into_inner()).map_err(to_status)?;
        let out = self.store.create_run(new).await.map_err(to_status)?;
        Ok(Response::new(pb::CreateRunResponse {
            created: out.created,
            record: Some(run_to_pb(out.record)),
            fingerprint_mismatch: out.fingerprint_mismatch,
        }))
    }

    async fn update_run(
        &self,
        request: Request<pb::UpdateRunRequest>,
    ) -> GrpcResult<pb::UpdateRunResponse> {
        let update = run_update_from_pb(request.into_inner()).map_err(to_status)?;
        let record = self.store.update_run(update).await.map_err(to_status)?;
        Ok(Response::new(pb::UpdateRunResponse {
            record: Some(run_to_pb(record)),
        }))
    }

    async fn start_run(
        &self,
        request: Request<pb::StartRunRequest>,
    ) -> GrpcResult<pb::StartRunResponse> {
        let req = start_run_from_pb(request.into_inner()).map_err(to_status)?;
        let started = self.store.start_run(req).await.map_err(to_status)?;
        Ok(Response::new(pb::StartRunResponse {
            record: Some(run_to_pb(started.record)),
            acquired: Some(acquired_to_pb(started.acquired)),
            first_seq: started.first_seq,
            history: started.history.into_iter().map(entry_to_pb).collect(),
        }))
    }

    async fn finish_run(
        &self,
        request: Request<pb::FinishRunRequest>,
    ) -> GrpcResult<pb::FinishRunResponse> {
        let req = finish_run_from_pb(request.into_inner()).map_err(to_status)?;
        let finished = self.store.finish_run(req).await.map_err(to_status)?;
        Ok(Response::new(pb::FinishRunResponse {
            record: Some(run_to_pb(finished.record)),
            first_seq: finished.first_seq,
            released: finished.released,
        }))
    }

    async fn get_run(&self, request: Request<pb::GetRunRequest>) -> GrpcResult<pb::GetRunResponse> {
        // An internal caller bound to some sessions reads another session's
        // run as absent, as it reads an unknown one: neither is its to see.
        let caller = request.extensions().get::<CallerIdentity>().cloned();
        let record = self
            .store
            .get_run(&request.into_inner().run_id)
            .await
            .map_err(to_status)?
            .filter(|run| caller.is_none_or(|caller| caller.may_act_on(&run.session_key)));
        Ok(Response::new(pb::GetRunResponse {
            record: record.map(run_to_pb),
        }))
    }

    async fn list_active_runs(
        &self,
        request: Request<pb::ListActiveRunsRequest>,
    ) -> GrpcResult<pb::ListActiveRunsResponse> {
        let owner = request.into_inner().owner;
        let runs = self
            .store
            .list_active_runs(owner.as_deref())
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::ListActiveRunsResponse {
            runs: runs.into_iter().map(run_to_pb).collect(),
        }))
    }

    async fn purge_expired_runs(
        &self,
        request: Request<pb::PurgeExpiredRunsRequest>,
    ) -> GrpcResult<pb::PurgeExpiredRunsResponse> {
        let purged = self
            .store
            .purge_expired_runs(request.into_inner().ended_before_ms)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::PurgeExpiredRunsResponse { purged }))
    }

    async fn acquire_leases(
        &self,
        request: Request<pb::AcquireLeasesRequest>,
    ) -> GrpcResult<pb::LeaseGrantResponse> {
        let req = request.into_inner();
        let req = crate::model::AcquireLeases {
            member: req.member,
            address: req.address,
            partitions: req.partitions,
            ttl_ms: req.ttl_ms,
            steal: req.steal,
        };
        let grant = self.store.acquire_leases(req).await.map_err(to_status)?;
        Ok(Response::new(grant_to_pb(grant)))
    }

    async fn renew_leases(
        &self,
        request: Request<pb::RenewLeasesRequest>,
    ) -> GrpcResult<pb::LeaseGrantResponse> {
        let req = request.into_inner();
        let req = crate::model::RenewLeases {
            member: req.member,
            tokens: req.tokens.into_iter().map(owner_token_from_pb).collect(),
            ttl_ms: req.ttl_ms,
        };
        let grant = self.store.renew_leases(req).await.map_err(to_status)?;
        Ok(Response::new(grant_to_pb(grant)))
    }

    async fn release_leases(
        &self,
        request: Request<pb::ReleaseLeasesRequest>,
    ) -> GrpcResult<pb::ReleaseLeasesResponse> {
        let tokens = request.into_inner().tokens;
        let tokens = tokens.into_iter().map(owner_token_from_pb).collect();
        let released = self.store.release_leases(tokens).await.map_err(to_status)?;
        Ok(Response::new(pb::ReleaseLeasesResponse { released }))
    }

    async fn list_leases(
        &self,
        _request: Request<pb::ListLeasesRequest>,
    ) -> GrpcResult<pb::ListLeasesResponse> {
        let table = self.store.list_leases().await.map_err(to_status)?;
        Ok(Response::new(table_to_pb(table)))
    }

    type WatchLeasesStream = ReceiverStream<Result<pb::ListLeasesResponse, Status>>;

    async fn watch_leases(
        &self,
        request: Request<pb::WatchLeasesRequest>,
    ) -> GrpcResult<Self::WatchLeasesStream> {
        let asked = request.into_inner().interval_ms;
        let interval_ms = match asked {
            0 => WATCH_DEFAULT_INTERVAL_MS,
            n => n.clamp(WATCH_MIN_INTERVAL_MS, WATCH_MAX_INTERVAL_MS),
        };
        let first = self.store.list_leases().await.map_err(to_status)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let store = self.store.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            // Polling, not a notification: with PostgreSQL other store
            // replicas write the same table, so only reading it sees all.
            let mut last = first.leases.clone();
            if tx.send(Ok(table_to_pb(first))).await.is_err() {
                return;
            }
            let mut tick = tokio::time::interval(Duration::from_millis(u64::from(interval_ms)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut quiet_intervals = 0;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = tx.closed() => return,
                    () = stopping.cancelled() => return,
                }
                quiet_intervals += 1;
                let item = match store.list_leases().await {
                    Ok(table)
                        if table.leases == last && quiet_intervals < WATCH_KEEPALIVE_INTERVALS =>
                    {
                        continue;
                    }
                    Ok(table) => {
                        last = table.leases.clone();
                        Ok(table_to_pb(table))
                    }
                    Err(err) => Err(to_status(err)),
                };
                quiet_intervals = 0;
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn heartbeat_member(
        &self,
        request: Request<pb::HeartbeatMemberRequest>,
    ) -> GrpcResult<pb::MembersResponse> {
        let req = heartbeat_from_pb(request.into_inner());
        let table = self.store.heartbeat_member(req).await.map_err(to_status)?;
        Ok(Response::new(members_to_pb(table)))
    }

    async fn leave_member(
        &self,
        request: Request<pb::LeaveMemberRequest>,
    ) -> GrpcResult<pb::LeaveMemberResponse> {
        let member = request.into_inner().member;
        let left = self.store.leave_member(&member).await.map_err(to_status)?;
        Ok(Response::new(pb::LeaveMemberResponse { left }))
    }

    async fn list_members(
        &self,
        _request: Request<pb::ListMembersRequest>,
    ) -> GrpcResult<pb::MembersResponse> {
        let table = self.store.list_members().await.map_err(to_status)?;
        Ok(Response::new(members_to_pb(table)))
    }
}

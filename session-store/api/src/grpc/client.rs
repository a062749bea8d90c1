//! `RemoteStore`: the `SessionStore` trait over gRPC, so the coordinator (and
//! tests) use a remote store exactly like a local one. Errors come back as the
//! same `StoreError` the server produced.

use async_trait::async_trait;
use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use clawgate_telemetry::tls::ClientTls;
use clawgate_telemetry::{ServiceTokens, TracedChannel, service_channel};
use tonic::transport::Endpoint;

use super::MAX_MESSAGE_BYTES;
use super::convert::*;
use super::status::{from_status, is_trimmed};
use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::store::SessionStore;

#[derive(Clone)]
pub struct RemoteStore {
    client: SessionStoreClient<TracedChannel>,
}

impl RemoteStore {
    /// Connects to `http://host:port`.
    pub async fn connect(address: &str) -> StoreResult<Self> {
        Self::connect_with(address, None, None).await
    }

    /// Connects to `http://host:port` (or `https://…`, over TLS with
    /// `tls`, or the Mozilla roots without it), every call carrying the
    /// first of `tokens` (docs/security.md).
    pub async fn connect_with(
        address: &str,
        tokens: Option<&ServiceTokens>,
        tls: Option<&ClientTls>,
    ) -> StoreResult<Self> {
        let endpoint = Endpoint::from_shared(address.to_owned())
            .map_err(|e| {
                StoreError::invalid(format!("bad session-store address {address:?}: {e}"))
            })?
            .tcp_nodelay(true);
        let tls = tls.unwrap_or_else(|| ClientTls::system());
        let channel = tls.channel(&endpoint).await.map_err(|e| {
            // tonic's own text is "transport error": the why (refused, a
            // certificate not trusted, …) is in its sources.
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                // A wrapped io::Error repeats its inner error's text.
                if !why.ends_with(&cause_text) {
                    why = format!("{why}: {cause_text}");
                }
                source = cause.source();
            }
            StoreError::Unavailable(format!(
                "cannot reach the session store at {address}: {why}"
            ))
        })?;
        Ok(Self::new(service_channel(channel, endpoint.uri(), tokens)))
    }

    /// A store over a channel already wrapped in the client trace layer.
    pub fn new(channel: TracedChannel) -> Self {
        let client = SessionStoreClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self { client }
    }

    fn client(&self) -> SessionStoreClient<TracedChannel> {
        self.client.clone()
    }
}

fn session(s: Option<pb::Session>) -> StoreResult<Session> {
    session_from_pb(s.ok_or_else(|| StoreError::Internal("response without a session".into()))?)
}

fn optional_id(raw: Option<String>) -> StoreResult<Option<SessionId>> {
    Ok(raw.as_deref().map(parse_session_id).transpose()?)
}

fn record(r: Option<pb::RunRecord>) -> StoreResult<RunRecord> {
    run_from_pb(r.ok_or_else(|| StoreError::Internal("response without a run record".into()))?)
}

#[async_trait]
impl SessionStore for RemoteStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        let res = self
            .client()
            .acquire_writer(acquire_to_pb(req))
            .await
            .map_err(from_status)?
            .into_inner();
        acquired_from_pb(res)
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let res = self
            .client()
            .release_writer(pb::ReleaseWriterRequest {
                session_key: key.as_str().to_owned(),
                run_id: run_id.to_owned(),
                fence_token,
                owner_token: owner_token.cloned().map(owner_token_to_pb),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(Released {
            released: res.released,
            session: res.session.map(session_from_pb).transpose()?,
        })
    }

    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        let res = self
            .client()
            .append(pb::AppendRequest {
                session_key: req.key.as_str().to_owned(),
                session_id: req.session_id.to_string(),
                run_id: req.run_id,
                fence_token: req.fence_token,
                entries: req.entries.into_iter().map(new_entry_to_pb).collect(),
                owner_token: req.owner_token.map(owner_token_to_pb),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(Appended {
            first_seq: res.first_seq,
            last_seq: res.last_seq,
            session: session(res.session)?,
        })
    }

    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        let res = self
            .client()
            .history(history_to_pb(query))
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(HistoryPage {
            session_id: optional_id(Some(res.session_id).filter(|s| !s.is_empty()))?,
            entries: res.entries.into_iter().map(entry_from_pb).collect(),
            has_more: res.has_more,
            total: res.total,
        })
    }

    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        let res = self
            .client()
            .get_session(pb::GetSessionRequest {
                session_key: key.as_str().to_owned(),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        res.session.map(session_from_pb).transpose()
    }

    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        let res = self
            .client()
            .list_sessions(pb::ListSessionsRequest {
                limit: query.limit,
                active_minutes: None,
                search: query.search,
                updated_since_ms: query.updated_since_ms,
            })
            .await
            .map_err(from_status)?
            .into_inner();
        res.sessions.into_iter().map(session_from_pb).collect()
    }

    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        let res = self
            .client()
            .reset_session(pb::ResetSessionRequest {
                session_key: key.as_str().to_owned(),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(ResetOutcome {
            session: session(res.session)?,
            previous_session_id: optional_id(res.previous_session_id)?,
            superseded_run_id: res.superseded_run_id,
        })
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let res = self
            .client()
            .delete_session(pb::DeleteSessionRequest {
                session_key: key.as_str().to_owned(),
                delete_transcript,
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(DeleteOutcome {
            deleted: res.deleted,
            previous_session_id: optional_id(res.previous_session_id)?,
            superseded_run_id: res.superseded_run_id,
        })
    }

    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        let res = self
            .client()
            .patch_session(patch_to_pb(req))
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(PatchOutcome {
            session: session(res.session)?,
            created: res.created,
        })
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let res = self
            .client()
            .create_run(new_run_to_pb(new))
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(CreateRunOutcome {
            created: res.created,
            record: record(res.record)?,
            fingerprint_mismatch: res.fingerprint_mismatch,
        })
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let run_id = update.run_id.clone();
        let status = match self.client().update_run(run_update_to_pb(update)).await {
            Ok(res) => return record(res.into_inner().record),
            Err(status) => status,
        };
        let trimmed = is_trimmed(&status);
        let mut err = from_status(status);
        // A large record comes back without its payloads: read it whole, so
        // the caller sees the same error as in process.
        if trimmed
            && let StoreError::RunVersionConflict { current, .. }
            | StoreError::RunTerminal { current } = &mut err
            && let Ok(Some(whole)) = self.get_run(&run_id).await
        {
            **current = whole;
        }
        Err(err)
    }

    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        let res = self
            .client()
            .start_run(start_run_to_pb(req))
            .await
            .map_err(from_status)?
            .into_inner();
        let acquired = res
            .acquired
            .ok_or_else(|| StoreError::Internal("StartRun answered without a fence".into()))?;
        Ok(Started {
            record: record(res.record)?,
            acquired: acquired_from_pb(acquired)?,
            first_seq: res.first_seq,
            history: res.history.into_iter().map(entry_from_pb).collect(),
        })
    }

    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        let res = self
            .client()
            .finish_run(finish_run_to_pb(req))
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(Finished {
            record: record(res.record)?,
            first_seq: res.first_seq,
            released: res.released,
        })
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let res = self
            .client()
            .get_run(pb::GetRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        res.record.map(run_from_pb).transpose()
    }

    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        let res = self
            .client()
            .list_active_runs(pb::ListActiveRunsRequest {
                owner: owner.map(str::to_owned),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        res.runs.into_iter().map(run_from_pb).collect()
    }

    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        let res = self
            .client()
            .purge_expired_runs(pb::PurgeExpiredRunsRequest { ended_before_ms })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(res.purged)
    }

    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        let res = self
            .client()
            .acquire_leases(pb::AcquireLeasesRequest {
                member: req.member,
                address: req.address,
                partitions: req.partitions,
                ttl_ms: req.ttl_ms,
                steal: req.steal,
            })
            .await
            .map_err(from_status)?;
        Ok(grant_from_pb(res.into_inner()))
    }

    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        let res = self
            .client()
            .renew_leases(pb::RenewLeasesRequest {
                member: req.member,
                tokens: req.tokens.into_iter().map(owner_token_to_pb).collect(),
                ttl_ms: req.ttl_ms,
            })
            .await
            .map_err(from_status)?;
        Ok(grant_from_pb(res.into_inner()))
    }

    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        let res = self
            .client()
            .release_leases(pb::ReleaseLeasesRequest {
                tokens: tokens.into_iter().map(owner_token_to_pb).collect(),
            })
            .await
            .map_err(from_status)?;
        Ok(res.into_inner().released)
    }

    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        let res = self
            .client()
            .list_leases(pb::ListLeasesRequest {})
            .await
            .map_err(from_status)?;
        Ok(table_from_pb(res.into_inner()))
    }

    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        let res = self
            .client()
            .heartbeat_member(heartbeat_to_pb(req))
            .await
            .map_err(from_status)?;
        Ok(members_from_pb(res.into_inner()))
    }

    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        let res = self
            .client()
            .leave_member(pb::LeaveMemberRequest {
                member: member.to_owned(),
            })
            .await
            .map_err(from_status)?;
        Ok(res.into_inner().left)
    }

    async fn list_members(&self) -> StoreResult<MemberTable> {
        let res = self
            .client()
            .list_members(pb::ListMembersRequest {})
            .await
            .map_err(from_status)?;
        Ok(members_from_pb(res.into_inner()))
    }
}

impl RemoteStore {
    /// The lease table now and after each change, as the store sees it.
    pub async fn watch_leases(
        &self,
        interval_ms: u32,
    ) -> StoreResult<impl futures::Stream<Item = StoreResult<LeaseTable>> + use<>> {
        let stream = self
            .client()
            .watch_leases(pb::WatchLeasesRequest { interval_ms })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(futures::StreamExt::map(stream, |item| {
            item.map(table_from_pb).map_err(from_status)
        }))
    }
}

//! Conversions between the protobuf messages and the domain types. Parsing a
//! request checks its shape (keys, UUIDs, enums); `limits` checks sizes.

use clawgate_proto::session_store::v1 as pb;

use crate::error::StoreError;
use crate::key::SessionKey;
use crate::model::*;

pub fn session_to_pb(s: Session) -> pb::Session {
    pb::Session {
        session_key: s.key.as_str().to_owned(),
        session_id: s.session_id.to_string(),
        active_writer_run_id: s.active_writer_run_id,
        fence_token: s.fence_token,
        created_at_ms: s.created_at_ms,
        updated_at_ms: s.updated_at_ms,
        label: s.label,
        last_run_id: s.last_run_id,
        last_run_status: status_to_pb(s.last_run_status) as i32,
        entry_count: s.entry_count,
        settings_json: s.settings_json,
    }
}

pub fn session_from_pb(s: pb::Session) -> Result<Session, StoreError> {
    Ok(Session {
        key: SessionKey::parse(&s.session_key)?,
        session_id: parse_session_id(&s.session_id)?,
        active_writer_run_id: s.active_writer_run_id,
        fence_token: s.fence_token,
        created_at_ms: s.created_at_ms,
        updated_at_ms: s.updated_at_ms,
        label: s.label,
        last_run_id: s.last_run_id,
        last_run_status: status_from_pb(s.last_run_status)?,
        entry_count: s.entry_count,
        // A store that predates settings sends none: the same as "{}".
        settings_json: match s.settings_json.as_str() {
            "" => EMPTY_SETTINGS.to_owned(),
            _ => s.settings_json,
        },
    })
}

pub fn patch_from_pb(r: pb::PatchSessionRequest) -> Result<PatchSession, StoreError> {
    Ok(PatchSession {
        key: SessionKey::parse(&r.session_key)?,
        patch_json: r.patch_json,
        create: r.create,
    })
}

pub fn patch_to_pb(p: PatchSession) -> pb::PatchSessionRequest {
    pb::PatchSessionRequest {
        session_key: p.key.as_str().to_owned(),
        patch_json: p.patch_json,
        create: p.create,
    }
}

pub fn status_to_pb(status: Option<RunStatus>) -> pb::RunStatus {
    use pb::RunStatus as P;
    match status {
        None => P::Unspecified,
        Some(RunStatus::Accepted) => P::Accepted,
        Some(RunStatus::Queued) => P::Queued,
        Some(RunStatus::Running) => P::Running,
        Some(RunStatus::Ok) => P::Ok,
        Some(RunStatus::Error) => P::Error,
        Some(RunStatus::Aborted) => P::Aborted,
        Some(RunStatus::Timeout) => P::Timeout,
        Some(RunStatus::Superseded) => P::Superseded,
        Some(RunStatus::Lost) => P::Lost,
    }
}

/// `UNSPECIFIED` is `None`; numbers outside the enum are refused.
pub fn status_from_pb(raw: i32) -> Result<Option<RunStatus>, StoreError> {
    use pb::RunStatus as P;
    let status =
        P::try_from(raw).map_err(|_| StoreError::invalid(format!("unknown run status {raw}")))?;
    Ok(match status {
        P::Unspecified => None,
        P::Accepted => Some(RunStatus::Accepted),
        P::Queued => Some(RunStatus::Queued),
        P::Running => Some(RunStatus::Running),
        P::Ok => Some(RunStatus::Ok),
        P::Error => Some(RunStatus::Error),
        P::Aborted => Some(RunStatus::Aborted),
        P::Timeout => Some(RunStatus::Timeout),
        P::Superseded => Some(RunStatus::Superseded),
        P::Lost => Some(RunStatus::Lost),
    })
}

fn required_status(raw: i32, field: &str) -> Result<RunStatus, StoreError> {
    status_from_pb(raw)?.ok_or_else(|| StoreError::invalid(format!("{field} must be set")))
}

pub fn metadata_to_pb(m: EntryMetadata) -> pb::EntryMetadata {
    pb::EntryMetadata {
        stop_reason: m.stop_reason,
        usage_json: m.usage_json,
        aborted: m.aborted,
    }
}

pub fn metadata_from_pb(m: Option<pb::EntryMetadata>) -> EntryMetadata {
    let m = m.unwrap_or_default();
    EntryMetadata {
        stop_reason: m.stop_reason,
        usage_json: m.usage_json,
        aborted: m.aborted,
    }
}

pub fn entry_to_pb(e: TranscriptEntry) -> pb::TranscriptEntry {
    pb::TranscriptEntry {
        seq: e.seq,
        role: e.role,
        content_json: e.content_json,
        timestamp_ms: e.timestamp_ms,
        run_id: e.run_id,
        metadata: Some(metadata_to_pb(e.metadata)),
    }
}

pub fn entry_from_pb(e: pb::TranscriptEntry) -> TranscriptEntry {
    TranscriptEntry {
        seq: e.seq,
        role: e.role,
        content_json: e.content_json,
        timestamp_ms: e.timestamp_ms,
        run_id: e.run_id,
        metadata: metadata_from_pb(e.metadata),
    }
}

pub fn new_entry_to_pb(e: NewEntry) -> pb::NewEntry {
    pb::NewEntry {
        role: e.role,
        content_json: e.content_json,
        timestamp_ms: e.timestamp_ms.unwrap_or(0),
        metadata: Some(metadata_to_pb(e.metadata)),
    }
}

pub fn new_entry_from_pb(e: pb::NewEntry) -> NewEntry {
    NewEntry {
        role: e.role,
        content_json: e.content_json,
        timestamp_ms: (e.timestamp_ms != 0).then_some(e.timestamp_ms),
        metadata: metadata_from_pb(e.metadata),
    }
}

pub fn run_to_pb(r: RunRecord) -> pb::RunRecord {
    pb::RunRecord {
        run_id: r.run_id,
        session_key: r.session_key,
        kind: r.kind,
        fingerprint: r.fingerprint,
        status: status_to_pb(Some(r.status)) as i32,
        version: r.version,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        started_at_ms: r.started_at_ms,
        ended_at_ms: r.ended_at_ms,
        owner: r.owner,
        request_json: r.request_json,
        outcome_json: r.outcome_json,
        session_id: r.session_id.map(|id| id.to_string()),
        fence_token: r.fence_token,
    }
}

pub fn run_from_pb(r: pb::RunRecord) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        status: required_status(r.status, "status")?,
        session_id: r.session_id.as_deref().map(parse_session_id).transpose()?,
        run_id: r.run_id,
        session_key: r.session_key,
        kind: r.kind,
        fingerprint: r.fingerprint,
        version: r.version,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        started_at_ms: r.started_at_ms,
        ended_at_ms: r.ended_at_ms,
        owner: r.owner,
        request_json: r.request_json,
        outcome_json: r.outcome_json,
        fence_token: r.fence_token,
    })
}

pub fn expected_session_from_pb(raw: &str) -> Result<ExpectedSession, StoreError> {
    match raw {
        "" | "current" => Ok(ExpectedSession::Current),
        id => Ok(ExpectedSession::Id(parse_session_id(id)?)),
    }
}

pub fn expected_session_to_pb(expected: &ExpectedSession) -> String {
    match expected {
        ExpectedSession::Current => "current".to_owned(),
        ExpectedSession::Id(id) => id.to_string(),
    }
}

pub fn acquire_from_pb(r: pb::AcquireWriterRequest) -> Result<AcquireWriter, StoreError> {
    let mode = acquire_mode_from_pb(r.mode)?;
    Ok(AcquireWriter {
        key: SessionKey::parse(&r.session_key)?,
        expected_session: expected_session_from_pb(&r.expected_session_id)?,
        expected_writer: r.expected_writer_run_id,
        run_id: r.run_id,
        mode,
        label: r.label,
        owner_token: r.owner_token.map(owner_token_from_pb),
    })
}

pub fn acquire_to_pb(r: AcquireWriter) -> pb::AcquireWriterRequest {
    pb::AcquireWriterRequest {
        session_key: r.key.as_str().to_owned(),
        expected_session_id: expected_session_to_pb(&r.expected_session),
        expected_writer_run_id: r.expected_writer,
        run_id: r.run_id,
        mode: acquire_mode_to_pb(r.mode),
        label: r.label,
        owner_token: r.owner_token.map(owner_token_to_pb),
    }
}

pub fn history_from_pb(r: pb::HistoryRequest) -> Result<HistoryQuery, StoreError> {
    let cursor = match (r.before_seq, r.after_seq) {
        (Some(_), Some(_)) => {
            return Err(StoreError::invalid(
                "set at most one of before_seq and after_seq",
            ));
        }
        (Some(before), None) => HistoryCursor::Before(before),
        (None, Some(after)) => HistoryCursor::After(after),
        (None, None) => HistoryCursor::Latest,
    };
    Ok(HistoryQuery {
        key: SessionKey::parse(&r.session_key)?,
        limit: r.limit,
        cursor,
        max_chars: r.max_chars,
        session_id: r.session_id.as_deref().map(parse_session_id).transpose()?,
    })
}

pub fn history_to_pb(q: HistoryQuery) -> pb::HistoryRequest {
    let (before_seq, after_seq) = match q.cursor {
        HistoryCursor::Latest => (None, None),
        HistoryCursor::Before(n) => (Some(n), None),
        HistoryCursor::After(n) => (None, Some(n)),
    };
    pb::HistoryRequest {
        session_key: q.key.as_str().to_owned(),
        limit: q.limit,
        before_seq,
        after_seq,
        max_chars: q.max_chars,
        session_id: q.session_id.map(|id| id.to_string()),
    }
}

pub fn run_update_from_pb(r: pb::UpdateRunRequest) -> Result<RunUpdate, StoreError> {
    Ok(RunUpdate {
        status: required_status(r.status, "status")?,
        session_id: r.session_id.as_deref().map(parse_session_id).transpose()?,
        run_id: r.run_id,
        expected_version: r.expected_version,
        owner: r.owner,
        outcome_json: r.outcome_json,
        fence_token: r.fence_token,
        owner_token: r.owner_token.map(owner_token_from_pb),
    })
}

pub fn run_update_to_pb(u: RunUpdate) -> pb::UpdateRunRequest {
    pb::UpdateRunRequest {
        run_id: u.run_id,
        expected_version: u.expected_version,
        status: status_to_pb(Some(u.status)) as i32,
        owner: u.owner,
        outcome_json: u.outcome_json,
        session_id: u.session_id.map(|id| id.to_string()),
        fence_token: u.fence_token,
        owner_token: u.owner_token.map(owner_token_to_pb),
    }
}

pub fn new_run_from_pb(r: pb::CreateRunRequest) -> Result<NewRun, StoreError> {
    Ok(NewRun {
        status: status_from_pb(r.status)?.unwrap_or(RunStatus::Accepted),
        session_key: SessionKey::parse(&r.session_key)?,
        run_id: r.run_id,
        kind: r.kind,
        fingerprint: r.fingerprint,
        owner: r.owner,
        request_json: r.request_json,
        owner_token: r.owner_token.map(owner_token_from_pb),
        expected_settings: r.expected_settings_digest,
        create_session: r.create_session,
    })
}

pub fn new_run_to_pb(n: NewRun) -> pb::CreateRunRequest {
    pb::CreateRunRequest {
        run_id: n.run_id,
        session_key: n.session_key.as_str().to_owned(),
        kind: n.kind,
        fingerprint: n.fingerprint,
        status: status_to_pb(Some(n.status)) as i32,
        owner: n.owner,
        request_json: n.request_json,
        owner_token: n.owner_token.map(owner_token_to_pb),
        expected_settings_digest: n.expected_settings,
        create_session: n.create_session,
    }
}

pub fn owner_token_to_pb(t: OwnerToken) -> pb::OwnerToken {
    pb::OwnerToken {
        partition: t.partition,
        member: t.member,
        epoch: t.epoch,
    }
}

pub fn owner_token_from_pb(t: pb::OwnerToken) -> OwnerToken {
    OwnerToken {
        partition: t.partition,
        member: t.member,
        epoch: t.epoch,
    }
}

pub fn lease_to_pb(l: Lease) -> pb::Lease {
    pb::Lease {
        partition: l.partition,
        owner: l.owner,
        address: l.address,
        epoch: l.epoch,
        expires_at_ms: l.expires_at_ms,
    }
}

pub fn lease_from_pb(l: pb::Lease) -> Lease {
    Lease {
        partition: l.partition,
        owner: l.owner,
        address: l.address,
        epoch: l.epoch,
        expires_at_ms: l.expires_at_ms,
    }
}

pub fn grant_to_pb(g: LeaseGrant) -> pb::LeaseGrantResponse {
    pb::LeaseGrantResponse {
        granted: g.granted.into_iter().map(lease_to_pb).collect(),
        refused: g.refused.into_iter().map(lease_to_pb).collect(),
        now_ms: g.now_ms,
    }
}

pub fn grant_from_pb(g: pb::LeaseGrantResponse) -> LeaseGrant {
    LeaseGrant {
        granted: g.granted.into_iter().map(lease_from_pb).collect(),
        refused: g.refused.into_iter().map(lease_from_pb).collect(),
        now_ms: g.now_ms,
    }
}

pub fn table_to_pb(t: LeaseTable) -> pb::ListLeasesResponse {
    pb::ListLeasesResponse {
        partition_count: t.partition_count,
        leases: t.leases.into_iter().map(lease_to_pb).collect(),
        now_ms: t.now_ms,
    }
}

pub fn table_from_pb(t: pb::ListLeasesResponse) -> LeaseTable {
    LeaseTable {
        partition_count: t.partition_count,
        leases: t.leases.into_iter().map(lease_from_pb).collect(),
        now_ms: t.now_ms,
    }
}

pub fn member_to_pb(m: Member) -> pb::Member {
    pb::Member {
        member: m.member,
        address: m.address,
        expires_at_ms: m.expires_at_ms,
    }
}

pub fn member_from_pb(m: pb::Member) -> Member {
    Member {
        member: m.member,
        address: m.address,
        expires_at_ms: m.expires_at_ms,
    }
}

pub fn heartbeat_to_pb(h: MemberHeartbeat) -> pb::HeartbeatMemberRequest {
    pb::HeartbeatMemberRequest {
        member: h.member,
        address: h.address,
        ttl_ms: h.ttl_ms,
    }
}

/// The request's shape needs no check here: the store checks it
/// (`rules::ownership::check_heartbeat`).
pub fn heartbeat_from_pb(r: pb::HeartbeatMemberRequest) -> MemberHeartbeat {
    MemberHeartbeat {
        member: r.member,
        address: r.address,
        ttl_ms: r.ttl_ms,
    }
}

pub fn members_to_pb(t: MemberTable) -> pb::MembersResponse {
    pb::MembersResponse {
        members: t.members.into_iter().map(member_to_pb).collect(),
        now_ms: t.now_ms,
    }
}

pub fn members_from_pb(t: pb::MembersResponse) -> MemberTable {
    MemberTable {
        members: t.members.into_iter().map(member_from_pb).collect(),
        now_ms: t.now_ms,
    }
}

fn acquire_mode_from_pb(raw: i32) -> Result<AcquireMode, StoreError> {
    match pb::AcquireMode::try_from(raw) {
        Ok(pb::AcquireMode::Unspecified | pb::AcquireMode::Cas) => Ok(AcquireMode::Cas),
        Ok(pb::AcquireMode::Takeover) => Ok(AcquireMode::Takeover),
        Err(_) => Err(StoreError::invalid(format!("unknown acquire mode {raw}"))),
    }
}

fn acquire_mode_to_pb(mode: AcquireMode) -> i32 {
    let mode = match mode {
        AcquireMode::Cas => pb::AcquireMode::Cas,
        AcquireMode::Takeover => pb::AcquireMode::Takeover,
    };
    mode as i32
}

pub fn start_run_from_pb(r: pb::StartRunRequest) -> Result<StartRun, StoreError> {
    Ok(StartRun {
        key: SessionKey::parse(&r.session_key)?,
        mode: acquire_mode_from_pb(r.mode)?,
        run_id: r.run_id,
        expected_version: r.expected_version,
        owner: r.owner,
        expected_writer: r.expected_writer_run_id,
        label: r.label,
        entries: r.entries.into_iter().map(new_entry_from_pb).collect(),
        history_limit: r.history_limit,
        owner_token: r.owner_token.map(owner_token_from_pb),
    })
}

pub fn start_run_to_pb(r: StartRun) -> pb::StartRunRequest {
    pb::StartRunRequest {
        run_id: r.run_id,
        session_key: r.key.as_str().to_owned(),
        expected_version: r.expected_version,
        owner: r.owner,
        mode: acquire_mode_to_pb(r.mode),
        expected_writer_run_id: r.expected_writer,
        label: r.label,
        entries: r.entries.into_iter().map(new_entry_to_pb).collect(),
        history_limit: r.history_limit,
        owner_token: r.owner_token.map(owner_token_to_pb),
    }
}

pub fn acquired_to_pb(a: Acquired) -> pb::AcquireWriterResponse {
    pb::AcquireWriterResponse {
        fence_token: a.fence_token,
        session: Some(session_to_pb(a.session)),
        superseded_run_id: a.superseded_run_id,
        session_created: a.session_created,
    }
}

pub fn acquired_from_pb(a: pb::AcquireWriterResponse) -> Result<Acquired, StoreError> {
    let session = a
        .session
        .ok_or_else(|| StoreError::Internal("response without a session".into()))?;
    Ok(Acquired {
        fence_token: a.fence_token,
        session: session_from_pb(session)?,
        superseded_run_id: a.superseded_run_id,
        session_created: a.session_created,
    })
}

pub fn finish_run_from_pb(r: pb::FinishRunRequest) -> Result<FinishRun, StoreError> {
    let writer = match (r.session_id.as_deref(), r.fence_token) {
        (Some(id), Some(fence_token)) => Some(HeldFence {
            session_id: parse_session_id(id)?,
            fence_token,
        }),
        (None, None) => None,
        _ => {
            return Err(StoreError::invalid(
                "FinishRun: session_id and fence_token go together",
            ));
        }
    };
    Ok(FinishRun {
        key: SessionKey::parse(&r.session_key)?,
        status: required_status(r.status, "status")?,
        run_id: r.run_id,
        expected_version: r.expected_version,
        outcome_json: r.outcome_json,
        writer,
        entries: r.entries.into_iter().map(new_entry_from_pb).collect(),
        owner_token: r.owner_token.map(owner_token_from_pb),
    })
}

pub fn finish_run_to_pb(r: FinishRun) -> pb::FinishRunRequest {
    pb::FinishRunRequest {
        run_id: r.run_id,
        session_key: r.key.as_str().to_owned(),
        expected_version: r.expected_version,
        status: status_to_pb(Some(r.status)) as i32,
        outcome_json: r.outcome_json,
        session_id: r.writer.map(|w| w.session_id.to_string()),
        fence_token: r.writer.map(|w| w.fence_token),
        entries: r.entries.into_iter().map(new_entry_to_pb).collect(),
        owner_token: r.owner_token.map(owner_token_to_pb),
    }
}

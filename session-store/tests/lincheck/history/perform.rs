//! Performing an operation through gRPC, and its answer in the model's terms.

use super::*;

// ---- performing it through gRPC -------------------------------------------------

pub fn run_name(run: Run) -> String {
    format!("r{run}")
}

pub fn parse_run(raw: &str) -> Run {
    raw.strip_prefix('r')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("run id {raw:?} is none the test made"))
}

pub fn member_name(member: Member) -> String {
    format!("m{member}")
}

pub fn parse_member(raw: &str) -> Member {
    raw.strip_prefix('m')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("member {raw:?} is none the test made"))
}

pub fn sid_of(id: uuid::Uuid) -> Sid {
    Sid(id.as_u128())
}

pub fn session_view(s: &Session) -> SessionView {
    SessionView {
        id: sid_of(s.session_id),
        writer: s.active_writer_run_id.as_deref().map(parse_run),
        fence: s.fence_token,
        entries: s.entry_count,
        last_run: s.last_run_id.as_deref().map(parse_run),
        last_status: s.last_run_status,
    }
}

pub fn run_view(r: &RunRecord) -> RunView {
    RunView {
        status: r.status,
        version: r.version,
        owner: parse_member(&r.owner),
        sid: r.session_id.map(sid_of),
        fence: r.fence_token,
    }
}

pub fn lease_view(l: &Lease) -> LeaseView {
    LeaseView {
        owner: l.owner.as_deref().map(parse_member),
        epoch: l.epoch,
    }
}

/// A refusal as the model states it, or the error if it is none of the
/// rules' refusals: then the operation's effect is unknown.
pub fn refusal(err: StoreError) -> Result<Refusal, StoreError> {
    let view = |s: Option<Box<Session>>| s.as_deref().map(session_view);
    Ok(match err {
        StoreError::StaleWriter { current, .. } => Refusal::StaleWriter(view(current)),
        StoreError::SessionReplaced { current, .. } => Refusal::SessionReplaced(view(current)),
        StoreError::WriterConflict { current, .. } => Refusal::WriterConflict(view(current)),
        StoreError::StaleOwner { current, .. } => {
            Refusal::StaleOwner(current.as_deref().map(lease_view))
        }
        StoreError::RunNotFound(_) => Refusal::RunNotFound,
        StoreError::RunVersionConflict { current, .. } => {
            Refusal::RunVersionConflict(run_view(&current))
        }
        StoreError::RunTerminal { current } => Refusal::RunTerminal(run_view(&current)),
        StoreError::InvalidArgument(_) => Refusal::Invalid,
        other => return Err(other),
    })
}

pub fn tagged_entries(role: &str, op: u64, count: u64) -> Vec<session_store::model::NewEntry> {
    (0..count)
        .map(|i| suite::text_entry(role, &tag(op, i)))
        .collect()
}

pub fn tag(op: u64, i: u64) -> String {
    format!("o{op}.{i}")
}

pub fn lease_answer(grant: LeaseGrant, partition: u32) -> Output {
    let granted = grant.granted.iter().find(|l| l.partition == partition);
    let refused = grant.refused.iter().find(|l| l.partition == partition);
    match (granted, refused) {
        (Some(lease), None) => Output::Lease {
            granted: true,
            lease: lease_view(lease),
            now: grant.now_ms as u64,
        },
        (None, Some(lease)) => Output::Lease {
            granted: false,
            lease: lease_view(lease),
            now: grant.now_ms as u64,
        },
        _ => panic!("the partition is neither granted nor refused: {grant:?}"),
    }
}

pub async fn perform(
    store: &dyn SessionStore,
    layout: &Layout,
    part: usize,
    input: &Input,
    op: u64,
    lease_ttl_ms: u64,
) -> Result<Output, StoreError> {
    let partition = layout.partitions[part];
    let key = |s: u8| &layout.keys[global(part, s)];
    let owner_token = |t: Option<Token>| {
        t.map(|t| OwnerToken {
            partition,
            member: member_name(t.member),
            epoch: t.epoch,
        })
    };
    let or_refused = |result: Result<Output, StoreError>| match result {
        Ok(out) => Ok(out),
        Err(err) => refusal(err).map(Output::Refused),
    };
    let acquired = |a: session_store::model::Acquired| m::Acquired {
        fence: a.fence_token,
        session: session_view(&a.session),
        superseded: a.superseded_run_id.as_deref().map(parse_run),
        created: a.session_created,
    };
    match *input {
        Input::Acquire {
            s,
            expect,
            expected_writer,
            run,
            takeover,
            token,
        } => {
            let req = AcquireWriter {
                key: key(s).clone(),
                expected_session: match expect {
                    None => ExpectedSession::Current,
                    Some(sid) => ExpectedSession::Id(uuid::Uuid::from_u128(sid.0)),
                },
                expected_writer: expected_writer.map(run_name),
                run_id: run_name(run),
                mode: match takeover {
                    true => AcquireMode::Takeover,
                    false => AcquireMode::Cas,
                },
                label: None,
                owner_token: owner_token(token),
            };
            or_refused(
                store
                    .acquire_writer(req)
                    .await
                    .map(|a| Output::Acquired(acquired(a))),
            )
        }
        Input::Release {
            s,
            run,
            fence,
            token,
        } => {
            let token = owner_token(token);
            let result = store
                .release_writer(key(s), &run_name(run), fence, token.as_ref())
                .await;
            or_refused(result.map(|r| Output::Released {
                released: r.released,
                session: r.session.as_ref().map(session_view),
            }))
        }
        Input::Append {
            s,
            sid,
            run,
            fence,
            count,
            token,
        } => {
            let req = AppendEntries {
                key: key(s).clone(),
                session_id: uuid::Uuid::from_u128(sid.0),
                run_id: run_name(run),
                fence_token: fence,
                entries: tagged_entries("assistant", op, count),
                owner_token: owner_token(token),
            };
            or_refused(store.append(req).await.map(|a| Output::Appended {
                first: a.first_seq,
                last: a.last_seq,
                session: session_view(&a.session),
            }))
        }
        Input::Reset { s } => {
            or_refused(store.reset_session(key(s)).await.map(|r| Output::Reset {
                session: session_view(&r.session),
                previous: r.previous_session_id.map(sid_of),
                superseded: r.superseded_run_id.as_deref().map(parse_run),
            }))
        }
        Input::Delete { s } => {
            or_refused(
                store
                    .delete_session(key(s), false)
                    .await
                    .map(|d| Output::Deleted {
                        deleted: d.deleted,
                        previous: d.previous_session_id.map(sid_of),
                        superseded: d.superseded_run_id.as_deref().map(parse_run),
                    }),
            )
        }
        Input::Read { s } => or_refused(
            store
                .get_session(key(s))
                .await
                .map(|s| Output::Read(s.as_ref().map(session_view))),
        ),
        Input::CreateRun {
            s,
            run,
            owner,
            token,
            ..
        } => {
            let new = NewRun {
                run_id: run_name(run),
                session_key: key(s).clone(),
                kind: "agent".into(),
                fingerprint: "fp".into(),
                status: RunStatus::Accepted,
                owner: member_name(owner),
                request_json: r#"{"message":"hi"}"#.into(),
                owner_token: owner_token(token),
                expected_settings: None,
                create_session: false,
            };
            or_refused(store.create_run(new).await.map(|c| Output::RunCreated {
                created: c.created,
                record: run_view(&c.record),
            }))
        }
        Input::StartRun {
            s,
            run,
            version,
            owner,
            takeover,
            expected_writer,
            count,
            history,
            token,
            ..
        } => {
            let req = StartRun {
                run_id: run_name(run),
                key: key(s).clone(),
                expected_version: version,
                owner: member_name(owner),
                mode: match takeover {
                    true => AcquireMode::Takeover,
                    false => AcquireMode::Cas,
                },
                expected_writer: expected_writer.map(run_name),
                label: None,
                entries: tagged_entries("user", op, count),
                history_limit: history,
                owner_token: owner_token(token),
            };
            or_refused(store.start_run(req).await.map(|st| Output::Started {
                record: run_view(&st.record),
                acquired: acquired(st.acquired),
                first_seq: st.first_seq,
                history: st.history.iter().map(|e| e.seq).collect(),
            }))
        }
        Input::FinishRun {
            s,
            run,
            version,
            status,
            writer,
            count,
            token,
            ..
        } => {
            let req = FinishRun {
                run_id: run_name(run),
                key: key(s).clone(),
                expected_version: version,
                status,
                outcome_json: None,
                writer: writer.map(|(sid, fence)| HeldFence {
                    session_id: uuid::Uuid::from_u128(sid.0),
                    fence_token: fence,
                }),
                entries: tagged_entries("assistant", op, count),
                owner_token: owner_token(token),
            };
            or_refused(store.finish_run(req).await.map(|f| Output::Finished {
                record: run_view(&f.record),
                first_seq: f.first_seq,
                released: f.released,
            }))
        }
        Input::TakeLease { member, steal } => {
            let req = AcquireLeases {
                member: member_name(member),
                address: format!("http://{}:50062", member_name(member)),
                partitions: vec![partition],
                ttl_ms: lease_ttl_ms,
                steal,
            };
            or_refused(
                store
                    .acquire_leases(req)
                    .await
                    .map(|g| lease_answer(g, partition)),
            )
        }
        Input::RenewLease { token } => {
            let req = RenewLeases {
                member: member_name(token.member),
                tokens: owner_token(Some(token)).into_iter().collect(),
                ttl_ms: lease_ttl_ms,
            };
            or_refused(
                store
                    .renew_leases(req)
                    .await
                    .map(|g| lease_answer(g, partition)),
            )
        }
        Input::ReleaseLease { token } => {
            let tokens = owner_token(Some(token)).into_iter().collect();
            or_refused(
                store
                    .release_leases(tokens)
                    .await
                    .map(|released| Output::LeaseReleased(released.contains(&partition))),
            )
        }
        Input::ReadLease => or_refused(
            store
                .list_leases()
                .await
                .map(|table| Output::Leases(lease_view(&table.leases[partition as usize]))),
        ),
    }
}

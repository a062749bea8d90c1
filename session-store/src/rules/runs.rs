//! Run records: their creation (idempotent by runId), their updates (CAS on
//! the version), and the start and finish of a run over its session's
//! slot.

use super::{SessionSlot, SessionState, acquire, release, reserve_seqs};
use crate::error::StoreError;
use crate::key::SessionKey;
use crate::model::*;

/// A run's record belongs to one session key for ever; a StartRun or
/// FinishRun naming another is refused.
fn check_run_key(record: &RunRecord, key: &SessionKey) -> Result<(), StoreError> {
    if record.session_key == key.as_str() {
        return Ok(());
    }
    Err(StoreError::invalid(format!(
        "run {:?} belongs to session {:?}, not {key}",
        record.run_id, record.session_key
    )))
}

/// StartRun over the run's record and its session's slot: UpdateRun to
/// `running`, AcquireWriter, then the fence check of the Append, in that
/// order, each refusing as the single call would. Both are changed only
/// when every check passed. Returns the acquisition (its session as it is
/// after the append) and the first seq of the entries (0 for none).
pub fn start_run(
    record: &mut RunRecord,
    slot: &mut SessionSlot,
    req: &StartRun,
    now_ms: i64,
    new_session_id: impl FnOnce() -> SessionId,
) -> Result<(Acquired, u64), StoreError> {
    check_run_key(record, &req.key)?;
    let mut next = record.clone();
    let running = RunUpdate {
        run_id: req.run_id.clone(),
        expected_version: req.expected_version,
        status: RunStatus::Running,
        owner: Some(req.owner.clone()),
        outcome_json: None,
        session_id: None,
        fence_token: None,
        owner_token: None,
    };
    update_run(&mut next, &running, now_ms)?;
    let mut next_slot = slot.clone();
    let acquire_req = AcquireWriter {
        key: req.key.clone(),
        expected_session: ExpectedSession::Current,
        expected_writer: req.expected_writer.clone(),
        run_id: req.run_id.clone(),
        mode: req.mode,
        label: req.label.clone(),
        owner_token: None,
    };
    let mut acquired = acquire(&mut next_slot, &acquire_req, now_ms, new_session_id)?;
    let fence = HeldFence {
        session_id: acquired.session.session_id,
        fence_token: acquired.fence_token,
    };
    let first_seq = match req.entries.len() {
        0 => 0,
        count => reserve_seqs(&mut next_slot, &req.key, &req.run_id, fence, count, now_ms)?,
    };
    next.session_id = Some(fence.session_id);
    next.fence_token = Some(fence.fence_token);
    acquired.session = next_slot.view(&req.key).expect("acquire made a session");
    *record = next;
    *slot = next_slot;
    Ok((acquired, first_seq))
}

/// FinishRun over the run's record and its session's slot: the fence check
/// of the Append, UpdateRun to the terminal status, then ReleaseWriter
/// (conditional, as ever). Both are changed only when every check passed.
/// Returns the first seq of the entries (0 for none) and whether the slot
/// was released.
pub fn finish_run(
    record: &mut RunRecord,
    slot: &mut SessionSlot,
    req: &FinishRun,
    now_ms: i64,
) -> Result<(u64, bool), StoreError> {
    check_run_key(record, &req.key)?;
    if !req.status.is_terminal() {
        return Err(StoreError::invalid(format!(
            "FinishRun ends a run: {} is not a terminal status",
            req.status.as_str()
        )));
    }
    let mut next_slot = slot.clone();
    let first_seq = match (req.entries.len(), req.writer) {
        (0, _) => 0,
        (count, Some(fence)) => {
            reserve_seqs(&mut next_slot, &req.key, &req.run_id, fence, count, now_ms)?
        }
        (_, None) => {
            return Err(StoreError::invalid(
                "FinishRun: entries are written under a fence, and none was given",
            ));
        }
    };
    let mut next = record.clone();
    let terminal = RunUpdate {
        run_id: req.run_id.clone(),
        expected_version: req.expected_version,
        status: req.status,
        owner: None,
        outcome_json: req.outcome_json.clone(),
        session_id: req.writer.map(|w| w.session_id),
        fence_token: req.writer.map(|w| w.fence_token),
        owner_token: None,
    };
    update_run(&mut next, &terminal, now_ms)?;
    let released = req
        .writer
        .is_some_and(|w| release(&mut next_slot, &req.run_id, w.fence_token, now_ms));
    note_run_status(&mut next_slot, &next);
    *record = next;
    *slot = next_slot;
    Ok((first_seq, released))
}

/// Keeps the session's "last run" columns in step with that run's record.
pub fn note_run_status(slot: &mut SessionSlot, record: &RunRecord) {
    if let Some(state) = slot.current.as_mut()
        && state.last_run_id.as_deref() == Some(record.run_id.as_str())
    {
        state.last_run_status = Some(record.status);
    }
}

/// Builds the record for CreateRun when none exists.
pub fn new_run_record(new: &NewRun, now_ms: i64) -> RunRecord {
    RunRecord {
        run_id: new.run_id.clone(),
        session_key: new.session_key.as_str().to_owned(),
        kind: new.kind.clone(),
        fingerprint: new.fingerprint.clone(),
        status: new.status,
        version: 1,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        started_at_ms: None,
        ended_at_ms: None,
        owner: new.owner.clone(),
        request_json: new.request_json.clone(),
        outcome_json: None,
        session_id: None,
        fence_token: None,
    }
}

/// CreateRun's session side, for a record about to be created: with
/// `create_session` a key with no session gets a fresh one (empty
/// settings, as a first PatchSession of `{}` with create makes it), then
/// the settings are checked ([`check_settings`]). Returns whether the slot
/// changed and has to be written; on a refusal it must not be.
pub fn admit_to_session(
    slot: &mut SessionSlot,
    new: &NewRun,
    now_ms: i64,
    new_session_id: impl FnOnce() -> SessionId,
) -> Result<bool, StoreError> {
    let created = new.create_session && slot.current.is_none();
    if created {
        slot.current = Some(SessionState::fresh(new_session_id(), now_ms, None));
    }
    check_settings(Some(slot), new)?;
    Ok(created)
}

/// CreateRun's check of the settings the run was made from, against the
/// key's slot (`None`: no row); only a record about to be created is
/// checked.
pub fn check_settings(slot: Option<&SessionSlot>, new: &NewRun) -> Result<(), StoreError> {
    let Some(expected) = new.expected_settings else {
        return Ok(());
    };
    let current = slot.and_then(|slot| slot.current.as_ref());
    match current.map(|session| session.settings_json.as_str()) {
        Some(settings) if settings_digest(settings) == expected => Ok(()),
        Some(_) => Err(StoreError::SettingsChanged(format!(
            "the settings of session {} changed since they were read",
            new.session_key
        ))),
        None => Err(StoreError::SettingsChanged(format!(
            "session {} is gone since its settings were read",
            new.session_key
        ))),
    }
}

/// CreateRun against an existing record: nothing changes.
pub fn existing_run(existing: RunRecord, new: &NewRun) -> CreateRunOutcome {
    CreateRunOutcome {
        created: false,
        fingerprint_mismatch: existing.fingerprint != new.fingerprint,
        record: existing,
    }
}

/// UpdateRun: CAS on the version; terminal records never change.
pub fn update_run(record: &mut RunRecord, upd: &RunUpdate, now_ms: i64) -> Result<(), StoreError> {
    if record.status.is_terminal() {
        return Err(StoreError::RunTerminal {
            current: Box::new(record.clone()),
        });
    }
    if record.version != upd.expected_version {
        return Err(StoreError::RunVersionConflict {
            expected: upd.expected_version,
            current: Box::new(record.clone()),
        });
    }
    record.status = upd.status;
    record.version += 1;
    record.updated_at_ms = now_ms;
    if upd.status == RunStatus::Running && record.started_at_ms.is_none() {
        record.started_at_ms = Some(now_ms);
    }
    if upd.status.is_terminal() {
        record.ended_at_ms = Some(now_ms);
    }
    if let Some(owner) = &upd.owner {
        record.owner = owner.clone();
    }
    if upd.outcome_json.is_some() {
        record.outcome_json = upd.outcome_json.clone();
    }
    if upd.session_id.is_some() {
        record.session_id = upd.session_id;
    }
    if upd.fence_token.is_some() {
        record.fence_token = upd.fence_token;
    }
    Ok(())
}

/// Whether a run record is gone for good: terminal and ended before `cutoff`.
pub fn run_expired(record: &RunRecord, ended_before_ms: i64) -> bool {
    record.status.is_terminal() && record.ended_at_ms.is_some_and(|t| t < ended_before_ms)
}

/// Whether a run belongs in ListActiveRuns(owner).
pub fn is_active_for(record: &RunRecord, owner: Option<&str>) -> bool {
    !record.status.is_terminal() && owner.is_none_or(|o| record.owner == o)
}

/// The ListActiveRuns order: oldest first, ties by runId.
pub fn oldest_first(mut runs: Vec<RunRecord>) -> Vec<RunRecord> {
    runs.sort_by(|a, b| (a.created_at_ms, &a.run_id).cmp(&(b.created_at_ms, &b.run_id)));
    runs
}

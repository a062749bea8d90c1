//! The transaction helpers every write of this backend uses: begin and
//! commit, statements, the rule application over a locked session row, and
//! the run and transcript rows.

use deadpool_postgres::{Client, GenericClient, Transaction};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, Row};

use super::rows::*;
use super::sql::*;
use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::{self, SessionSlot};

/// Writes use READ COMMITTED: every decision is taken on rows locked FOR
/// UPDATE, which a statement reads in their latest committed version once it
/// holds the lock. Reads spanning several statements use a read-only
/// REPEATABLE READ snapshot.
pub(super) async fn begin(client: &mut Client, snapshot: bool) -> StoreResult<Transaction<'_>> {
    let (level, read_only) = match snapshot {
        true => (IsolationLevel::RepeatableRead, true),
        false => (IsolationLevel::ReadCommitted, false),
    };
    let builder = client.build_transaction().isolation_level(level);
    builder.read_only(read_only).start().await.map_err(db_error)
}

pub(super) async fn commit(tx: Transaction<'_>) -> StoreResult<()> {
    tx.commit().await.map_err(db_error)
}

pub(super) async fn batch(tx: &Transaction<'_>, sql: &str) -> StoreResult<()> {
    tx.batch_execute(sql).await.map_err(db_error)
}

type Params<'a> = [&'a (dyn ToSql + Sync)];

pub(super) async fn fetch(
    c: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<Vec<Row>> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.query(&statement, params).await.map_err(db_error)
}

/// CreateRun's check of the settings it was made from, against the session
/// row read in its transaction (`None`: no row, or nothing was read).
pub(super) fn check_settings_row(row: Option<&Row>, new: &NewRun) -> StoreResult<()> {
    let slot = row.map(slot_from_row).transpose()?;
    rules::check_settings(slot.as_ref(), new)
}

/// CreateRun's `create_session`, in its transaction after the run row: the
/// session row locked (created when it has none, empty settings), then the
/// settings check against it. A refusal rolls the creation back with the
/// run's insert.
pub(super) async fn create_session_for_run(tx: &Transaction<'_>, new: &NewRun) -> StoreResult<()> {
    apply(tx, &new.session_key, true, |slot| {
        rules::admit_to_session(
            slot,
            new,
            clawgate_common::clock::now_ms(),
            uuid::Uuid::new_v4,
        )
    })
    .await
    .map(drop)
}

pub(super) async fn fetch_opt(
    c: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<Option<Row>> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.query_opt(&statement, params).await.map_err(db_error)
}

pub(super) async fn run(
    c: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<u64> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.execute(&statement, params).await.map_err(db_error)
}

/// The write pattern: lock the session row of `key` (creating it first when
/// `create`; a concurrent creator makes the INSERT wait, then do nothing),
/// apply `rule` to its slot, and write the row back if the rule changed it.
/// Without a row the slot is the default one (no session, fence 0), which no
/// rule changes without creating. On error the caller's transaction rolls
/// back, a row creation included.
pub(super) async fn apply<T>(
    tx: &Transaction<'_>,
    key: &SessionKey,
    create: bool,
    rule: impl FnOnce(&mut SessionSlot) -> StoreResult<T>,
) -> StoreResult<T> {
    if create {
        run(tx, INSERT_SESSION, &[&key.as_str()]).await?;
    }
    let row = fetch_opt(tx, LOCK_SESSION, &[&key.as_str()]).await?;
    let before = row
        .as_ref()
        .map(slot_from_row)
        .transpose()?
        .unwrap_or_default();
    let mut slot = before.clone();
    let outcome = rule(&mut slot)?;
    if slot != before {
        let s = slot.current.as_ref();
        let writer = s.and_then(|s| s.writer.as_ref());
        let (session_id, writer_fence) = (
            s.map(|s| s.session_id.to_string()),
            writer.map(|w| to_db(w.fence)),
        );
        #[rustfmt::skip]
        let params: [&(dyn ToSql + Sync); 12] = [
            &key.as_str(), &to_db(slot.last_fence), &session_id, &writer.map(|w| w.run_id.as_str()),
            &writer_fence, &s.map(|s| s.created_at_ms), &s.map(|s| s.updated_at_ms),
            &s.and_then(|s| s.label.as_deref()), &s.and_then(|s| s.last_run_id.as_deref()),
            &s.and_then(|s| s.last_run_status.map(RunStatus::as_str)),
            &to_db(s.map_or(0, |s| s.entry_count)),
            &s.map_or(EMPTY_SETTINGS, |s| s.settings_json.as_str()),
        ];
        if run(tx, UPDATE_SESSION, &params).await? != 1 {
            return Err(StoreError::internal(format!(
                "{key}: no session row to update"
            )));
        }
    }
    Ok(outcome)
}

/// The run record, locked FOR UPDATE until the transaction ends.
pub(super) async fn lock_run(tx: &Transaction<'_>, run_id: &str) -> StoreResult<RunRecord> {
    match fetch_opt(tx, LOCK_RUN, &[&run_id]).await? {
        Some(row) => run_from_row(&row),
        None => Err(StoreError::RunNotFound(run_id.to_owned())),
    }
}

/// Writes back the changing columns of a locked run record.
pub(super) async fn store_run(tx: &Transaction<'_>, r: &RunRecord) -> StoreResult<()> {
    let (session_id, fence) = (
        r.session_id.map(|id| id.to_string()),
        r.fence_token.map(to_db),
    );
    #[rustfmt::skip]
    let params: [&(dyn ToSql + Sync); 10] = [
        &r.run_id, &r.status.as_str(), &to_db(r.version), &r.updated_at_ms, &r.started_at_ms,
        &r.ended_at_ms, &r.owner, &r.outcome_json, &session_id, &fence,
    ];
    run(tx, UPDATE_RUN, &params).await.map(drop)
}

/// Inserts all entries in one statement (one array per column).
pub(super) async fn insert_entries(
    tx: &Transaction<'_>,
    session_id: SessionId,
    entries: &[TranscriptEntry],
) -> StoreResult<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = entries.iter().map(|e| to_db(e.seq)).collect();
    let roles: Vec<&str> = entries.iter().map(|e| e.role.as_str()).collect();
    let contents: Vec<&str> = entries.iter().map(|e| e.content_json.as_str()).collect();
    let timestamps: Vec<i64> = entries.iter().map(|e| e.timestamp_ms).collect();
    let run_ids: Vec<&str> = entries.iter().map(|e| e.run_id.as_str()).collect();
    let meta = entries.iter().map(|e| &e.metadata);
    let stop_reasons: Vec<Option<&str>> = meta.clone().map(|m| m.stop_reason.as_deref()).collect();
    let usages: Vec<Option<&str>> = meta.clone().map(|m| m.usage_json.as_deref()).collect();
    let aborted: Vec<bool> = meta.map(|m| m.aborted).collect();
    let id = session_id.to_string();
    #[rustfmt::skip]
    let params: [&(dyn ToSql + Sync); 9] = [
        &id, &seqs, &roles, &contents, &timestamps, &run_ids, &stop_reasons, &usages, &aborted,
    ];
    run(tx, INSERT_ENTRIES, &params).await.map(drop)
}

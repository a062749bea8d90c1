//! Row decoding, the u64 ↔ bigint mapping, and driver errors.

use tokio_postgres::Row;
use tokio_postgres::types::FromSql;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::model::*;
use crate::rules::{SessionSlot, SessionState, Writer};

pub(super) fn col<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> StoreResult<T> {
    row.try_get(idx)
        .map_err(|e| StoreError::internal(describe(&e)))
}

pub(super) fn parse_uuid(text: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(text).map_err(StoreError::internal)
}

pub(super) fn parse_status(text: &str) -> StoreResult<RunStatus> {
    RunStatus::parse(text)
        .ok_or_else(|| StoreError::internal(format!("unknown run status {text:?} in the database")))
}

/// u64 counters (fences, seqs, versions, callers' run fence tokens) are kept
/// bit for bit in bigint columns: lossless both ways. The ones the store
/// issues count up from 0 and never reach the sign bit.
pub(super) fn to_db(value: u64) -> i64 {
    value as i64
}

pub(super) fn from_db(value: i64) -> u64 {
    value as u64
}

/// Decodes a row of `select_sessions!`.
pub(super) fn slot_from_row(row: &Row) -> StoreResult<SessionSlot> {
    let last_fence = from_db(col(row, 1)?);
    let Some(session_id) = col::<Option<String>>(row, 2)? else {
        return Ok(SessionSlot {
            last_fence,
            current: None,
        });
    };
    let writer = match (col(row, 3)?, col::<Option<i64>>(row, 4)?) {
        (Some(run_id), Some(fence)) => Some(Writer {
            run_id,
            fence: from_db(fence),
        }),
        _ => None,
    };
    let required = |idx| {
        col::<Option<i64>>(row, idx)?
            .ok_or_else(|| StoreError::internal("session row without timestamps"))
    };
    let last_run_status = col::<Option<String>>(row, 9)?;
    Ok(SessionSlot {
        last_fence,
        current: Some(SessionState {
            session_id: parse_uuid(&session_id)?,
            writer,
            created_at_ms: required(5)?,
            updated_at_ms: required(6)?,
            label: col(row, 7)?,
            last_run_id: col(row, 8)?,
            last_run_status: last_run_status.as_deref().map(parse_status).transpose()?,
            entry_count: from_db(col(row, 10)?),
            settings_json: col(row, 11)?,
        }),
    })
}

/// Decodes a row of `select_runs!`.
pub(super) fn run_from_row(row: &Row) -> StoreResult<RunRecord> {
    let session_id = col::<Option<String>>(row, 13)?;
    Ok(RunRecord {
        run_id: col(row, 0)?,
        session_key: col(row, 1)?,
        kind: col(row, 2)?,
        fingerprint: col(row, 3)?,
        status: parse_status(col(row, 4)?)?,
        version: from_db(col(row, 5)?),
        created_at_ms: col(row, 6)?,
        updated_at_ms: col(row, 7)?,
        started_at_ms: col(row, 8)?,
        ended_at_ms: col(row, 9)?,
        owner: col(row, 10)?,
        request_json: col(row, 11)?,
        outcome_json: col(row, 12)?,
        session_id: session_id.as_deref().map(parse_uuid).transpose()?,
        fence_token: col::<Option<i64>>(row, 14)?.map(from_db),
    })
}

pub(super) fn entry_from_row(row: &Row) -> StoreResult<TranscriptEntry> {
    Ok(TranscriptEntry {
        seq: from_db(col(row, 0)?),
        role: col(row, 1)?,
        content_json: col(row, 2)?,
        timestamp_ms: col(row, 3)?,
        run_id: col(row, 4)?,
        metadata: EntryMetadata {
            stop_reason: col(row, 5)?,
            usage_json: col(row, 6)?,
            aborted: col(row, 7)?,
        },
    })
}

/// Maps a driver error: trouble worth a retry (connection, server shutdown,
/// resources, timeouts, serialization) is Unavailable; text PostgreSQL cannot
/// store (a NUL character) is the caller's; anything else is Internal.
pub(super) fn db_error(err: tokio_postgres::Error) -> StoreError {
    let message = describe(&err);
    let Some(code) = err.code().map(|c| c.code()) else {
        let io = std::error::Error::source(&err).is_some_and(|s| s.is::<std::io::Error>());
        return if err.is_closed() || io {
            StoreError::Unavailable(message)
        } else {
            StoreError::Internal(message)
        };
    };
    match code {
        "22021" | "22P05" => {
            StoreError::invalid(format!("a text value cannot be stored: {message}"))
        }
        "40001" | "40P01" | "55P03" => StoreError::Unavailable(message),
        _ if ["08", "53", "57"]
            .iter()
            .any(|class| code.starts_with(class)) =>
        {
            StoreError::Unavailable(message)
        }
        _ => StoreError::Internal(message),
    }
}

/// tokio-postgres' Display omits the causes (the server's message, the
/// TLS handshake's verdict on a certificate): each is added.
pub(super) fn describe(err: &tokio_postgres::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(inner) = cause {
        let said = inner.to_string();
        if !text.ends_with(&said) {
            text = format!("{text}: {said}");
        }
        cause = inner.source();
    }
    text
}

//! The member registry on PostgreSQL: `coordinator_members`, one row per
//! coordinator, expiry by the database's clock (as the leases').
//!
//! A heartbeat locks the table `SHARE ROW EXCLUSIVE` for its transaction:
//! heartbeats from every store replica apply one after the other, so the cap
//! on live members counts what the others committed, while plain reads
//! (ListMembers) never wait. The decisions are `rules::ownership`'s, on the
//! rows read under that lock. The table lock is the only lock a heartbeat
//! takes, and nothing else locks this table, so it joins no deadlock.

use deadpool_postgres::{GenericClient, Transaction};

use super::rows::col;
use super::{batch, fetch, fetch_opt, run};
use crate::error::{StoreError, StoreResult};
use crate::model::{Member, MemberHeartbeat, MemberTable};
use crate::rules::ownership;

/// Every entry, expired ones included, and the database's clock, read once
/// for the whole statement (a materialized CTE): one row with a NULL member
/// when the registry is empty.
const SELECT_MEMBERS: &str = "WITH clock AS MATERIALIZED \
    (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) \
    SELECT c.now_ms, m.member, m.address, m.expires_at_ms \
    FROM clock c LEFT JOIN coordinator_members m ON true";
const LOCK_MEMBERS: &str = "LOCK TABLE coordinator_members IN SHARE ROW EXCLUSIVE MODE";
const PRUNE_MEMBERS: &str = "DELETE FROM coordinator_members WHERE expires_at_ms <= $1";
const UPSERT_MEMBER: &str = "INSERT INTO coordinator_members (member, address, expires_at_ms) \
    VALUES ($1, $2, $3) ON CONFLICT (member) DO UPDATE \
    SET address = excluded.address, expires_at_ms = excluded.expires_at_ms";
/// Whether the deleted row was live, by the database's clock.
const DELETE_MEMBER: &str = "DELETE FROM coordinator_members WHERE member = $1 \
    RETURNING expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Every entry and the database's clock.
async fn entries(c: &impl GenericClient) -> StoreResult<(Vec<Member>, i64)> {
    let rows = fetch(c, SELECT_MEMBERS, &[]).await?;
    let now_ms = match rows.first() {
        Some(row) => col(row, 0)?,
        None => return Err(StoreError::internal("the clock row is missing")),
    };
    let mut members = Vec::with_capacity(rows.len());
    for row in &rows {
        if let Some(member) = col::<Option<String>>(row, 1)? {
            members.push(Member {
                member,
                address: col(row, 2)?,
                expires_at_ms: col(row, 3)?,
            });
        }
    }
    Ok((members, now_ms))
}

/// HeartbeatMember in `tx` (committed by the caller).
pub(super) async fn heartbeat(
    tx: &Transaction<'_>,
    req: &MemberHeartbeat,
    max_members: usize,
) -> StoreResult<MemberTable> {
    batch(tx, LOCK_MEMBERS).await?;
    let (entries, now_ms) = entries(tx).await?;
    let (mut live, expired) = ownership::split_members(entries, now_ms);
    let entry = ownership::heartbeat(&mut live, req, now_ms, max_members)?;
    if !expired.is_empty() {
        run(tx, PRUNE_MEMBERS, &[&now_ms]).await?;
    }
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&entry.member, &entry.address, &entry.expires_at_ms];
    run(tx, UPSERT_MEMBER, &params).await?;
    Ok(MemberTable {
        members: live,
        now_ms,
    })
}

/// LeaveMember: whether the member had a live entry.
pub(super) async fn leave(c: &impl GenericClient, member: &str) -> StoreResult<bool> {
    let row = fetch_opt(c, DELETE_MEMBER, &[&member]).await?;
    row.map_or(Ok(false), |row| col(&row, 0))
}

/// The live members, by the database's clock.
pub(super) async fn list(c: &impl GenericClient) -> StoreResult<MemberTable> {
    let (entries, now_ms) = entries(c).await?;
    Ok(MemberTable {
        members: ownership::split_members(entries, now_ms).0,
        now_ms,
    })
}

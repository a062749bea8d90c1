//! Partition ownership on PostgreSQL.
//!
//! Every write of a coordinator locks its partition's lease row
//! `FOR KEY SHARE` in its own transaction, first, and checks the owner token
//! on what it read (`rules::ownership::check_owner`). A take locks the rows
//! `FOR UPDATE`, which conflicts with that: it waits for every in-flight write
//! of the tenure it ends to commit or roll back, and every write that locks
//! after it sees the new epoch. Key-share locks do not conflict with each
//! other, so writes to one partition run side by side; nor with the
//! `FOR NO KEY UPDATE` of a renewal or a release, which change no epoch (a
//! release is followed by a take, which waits for the writes).
//!
//! `FOR KEY SHARE` rather than `FOR SHARE`: it is the weakest lock that a
//! `FOR UPDATE` waits for, so renewals never queue behind writes.
//!
//! Lock order: lease row(s), in partition order, before any run or session
//! row. A write locks one lease row only; takes, renewals and releases lock
//! nothing else. So lease locks cannot join a deadlock cycle.

use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::Row;

use super::rows::{col, from_db, to_db};
use super::{fetch, fetch_opt, run};
use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::{Lease, LeaseGrant, OwnerToken};
use crate::rules::ownership;

// Every lease query also reads the database's clock in Unix milliseconds:
// lease expiry is decided by one clock, whichever replica asks.
macro_rules! select_leases {
    ($tail:literal) => {
        concat!(
            "SELECT partition, owner, address, epoch, expires_at_ms, ",
            "(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM partition_leases ",
            $tail
        )
    };
}

const SHARE_LEASE: &str = select_leases!("WHERE partition = $1 FOR KEY SHARE");
/// A take or a release: waits for the writes of the tenures it ends (a
/// write holds its lease row `FOR KEY SHARE` from its token check to its
/// commit, which only `FOR UPDATE` waits for). A release that did not
/// wait could answer before a write of its tenure commits, and a reader
/// who heard of the release would miss that write, then see it.
pub(super) const LOCK_FOR_TAKE: &str =
    select_leases!("WHERE partition = ANY($1) ORDER BY partition FOR UPDATE");
/// A renewal: same owner and epoch, so no need to wait for writes.
pub(super) const LOCK_FOR_RENEW: &str =
    select_leases!("WHERE partition = ANY($1) ORDER BY partition FOR NO KEY UPDATE");
const LIST_LEASES: &str = select_leases!("ORDER BY partition");
const UPDATE_LEASES: &str = "UPDATE partition_leases AS l SET owner = u.owner, \
    address = u.address, epoch = u.epoch, expires_at_ms = u.expires_at_ms \
    FROM unnest($1::integer[], $2::text[], $3::text[], $4::bigint[], $5::bigint[]) \
    AS u(partition, owner, address, epoch, expires_at_ms) WHERE l.partition = u.partition";

/// Records the partition count at the first start and checks it at every
/// later one; creates the lease rows. Runs inside the migration transaction
/// (under its advisory lock).
pub(super) async fn settle_partitions(tx: &Transaction<'_>, partitions: u32) -> StoreResult<()> {
    run(
        tx,
        "INSERT INTO store_settings (name, value) VALUES ('partition_count', $1) \
         ON CONFLICT (name) DO NOTHING",
        &[&i64::from(partitions)],
    )
    .await?;
    let row = fetch_opt(
        tx,
        "SELECT value FROM store_settings WHERE name = 'partition_count'",
        &[],
    )
    .await?
    .ok_or_else(|| StoreError::internal("no partition_count setting"))?;
    let stored: i64 = col(&row, 0)?;
    if stored != i64::from(partitions) {
        return Err(StoreError::invalid(format!(
            "this store was created with {stored} partitions, not {partitions}; the partition count cannot change"
        )));
    }
    run(
        tx,
        "INSERT INTO partition_leases (partition) SELECT generate_series(0, $1 - 1) \
         ON CONFLICT (partition) DO NOTHING",
        &[&(partitions as i32)],
    )
    .await
    .map(drop)
}

fn lease_from_row(row: &Row) -> StoreResult<(Lease, i64)> {
    let partition: i32 = col(row, 0)?;
    let lease = Lease {
        partition: partition as u32,
        owner: col(row, 1)?,
        address: col(row, 2)?,
        epoch: from_db(col(row, 3)?),
        expires_at_ms: col(row, 4)?,
    };
    Ok((lease, col(row, 5)?))
}

/// The owner check of a write to `key`, in the write's transaction: locks the
/// partition's lease row `FOR KEY SHARE` until that transaction ends.
pub(super) async fn check_owner(
    tx: &Transaction<'_>,
    key: &SessionKey,
    token: Option<&OwnerToken>,
    partitions: u32,
) -> StoreResult<()> {
    let partition = ownership::partition(key, partitions);
    let row = fetch_opt(tx, SHARE_LEASE, &[&(partition as i32)]).await?;
    let lease = match row {
        Some(row) => lease_from_row(&row)?.0,
        None => Lease::unowned(partition),
    };
    ownership::check_owner(token, partition, &lease)
}

/// Locks the leases of `partitions` (in order) with `lock` (`LOCK_FOR_*`),
/// applies `rule` to each, and writes back the ones it changed. Returns each
/// lease after the rule, with whether the rule granted it, and the
/// database's clock.
pub(super) async fn apply(
    tx: &Transaction<'_>,
    lock: &str,
    partitions: &[u32],
    mut rule: impl FnMut(&mut Lease, i64) -> bool,
) -> StoreResult<LeaseGrant> {
    let wanted: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
    let rows = fetch(tx, lock, &[&wanted]).await?;
    if rows.len() != wanted.len() {
        return Err(StoreError::internal("a partition has no lease row"));
    }
    // One decision time for the whole call: the clock as the first row was
    // read (every row was locked by then).
    let mut now_ms = None;
    let mut outcomes = Vec::with_capacity(rows.len());
    let mut changed = Vec::new();
    for row in &rows {
        let (mut lease, now) = lease_from_row(row)?;
        let now = *now_ms.get_or_insert(now);
        let granted = rule(&mut lease, now);
        if granted {
            changed.push(lease.clone());
        }
        outcomes.push((lease, granted));
    }
    if !changed.is_empty() {
        write(tx, &changed).await?;
    }
    Ok(ownership::grant(outcomes, now_ms.unwrap_or_default()))
}

async fn write(tx: &Transaction<'_>, leases: &[Lease]) -> StoreResult<()> {
    let partitions: Vec<i32> = leases.iter().map(|l| l.partition as i32).collect();
    let owners: Vec<Option<&str>> = leases.iter().map(|l| l.owner.as_deref()).collect();
    let addresses: Vec<&str> = leases.iter().map(|l| l.address.as_str()).collect();
    let epochs: Vec<i64> = leases.iter().map(|l| to_db(l.epoch)).collect();
    let expiries: Vec<i64> = leases.iter().map(|l| l.expires_at_ms).collect();
    run(
        tx,
        UPDATE_LEASES,
        &[&partitions, &owners, &addresses, &epochs, &expiries],
    )
    .await
    .map(drop)
}

/// Every lease, in partition order, and the database's clock.
pub(super) async fn list(c: &impl GenericClient) -> StoreResult<(Vec<Lease>, i64)> {
    let rows = fetch(c, LIST_LEASES, &[]).await?;
    let mut now_ms = None;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        let (lease, now) = lease_from_row(row)?;
        now_ms.get_or_insert(now);
        leases.push(lease);
    }
    // `settle_partitions` created a row per partition at start, and a store
    // has at least one.
    let now_ms = now_ms.ok_or_else(|| StoreError::internal("no lease rows"))?;
    Ok((leases, now_ms))
}

//! The embedded backend's tables and the reads and writes of their rows
//! (JSON values), each inside the caller's redb transaction.

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::SessionSlot;
use crate::rules::ownership;

/// Session key → `SessionSlot` (JSON). Rows are never removed: they carry the
/// fence counter that must not be reused. Fields added later have serde
/// defaults, so rows written before them still decode (`settings_json`).
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
/// (sessionId as u128, seq) → `TranscriptEntry` (JSON).
pub(super) const TRANSCRIPTS: TableDefinition<(u128, u64), &[u8]> =
    TableDefinition::new("transcripts");
/// runId → `RunRecord` (JSON).
pub(super) const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
/// partition → `Lease` (JSON); a partition without a row was never owned.
pub(super) const LEASES: TableDefinition<u32, &[u8]> = TableDefinition::new("leases");
/// member id → `Member` (JSON): the member registry. Expired rows stay until
/// the next heartbeat prunes them; nothing answers them.
pub(super) const MEMBERS: TableDefinition<&str, &[u8]> = TableDefinition::new("members");
/// Settings fixed at the store's first start (`partition_count`).
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store types always serialize")
}

pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, redb::Error> {
    serde_json::from_slice(bytes)
        .map_err(|e| redb::Error::Corrupted(format!("undecodable row: {e}")))
}

pub(super) fn load_slot(
    txn: &WriteTransaction,
    key: &SessionKey,
) -> Result<SessionSlot, redb::Error> {
    let table = txn.open_table(SESSIONS)?;
    let slot = table.get(key.as_str())?;
    slot.map_or(Ok(SessionSlot::default()), |row| decode(row.value()))
}

pub(super) fn store_slot(
    txn: &WriteTransaction,
    key: &SessionKey,
    slot: &SessionSlot,
) -> Result<(), redb::Error> {
    txn.open_table(SESSIONS)?
        .insert(key.as_str(), encode(slot).as_slice())?;
    Ok(())
}

pub(super) fn load_run(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    run_id: &str,
) -> Result<Option<RunRecord>, redb::Error> {
    table
        .get(run_id)?
        .map(|row| decode(row.value()))
        .transpose()
}

pub(super) fn store_run(txn: &WriteTransaction, record: &RunRecord) -> Result<(), redb::Error> {
    txn.open_table(RUNS)?
        .insert(record.run_id.as_str(), encode(record).as_slice())?;
    Ok(())
}

pub(super) fn insert_entries(
    txn: &WriteTransaction,
    sid: u128,
    entries: &[TranscriptEntry],
) -> Result<(), redb::Error> {
    let mut transcripts = txn.open_table(TRANSCRIPTS)?;
    for entry in entries {
        transcripts.insert((sid, entry.seq), encode(entry).as_slice())?;
    }
    Ok(())
}

pub(super) fn read_slot(
    txn: &redb::ReadTransaction,
    key: &SessionKey,
) -> Result<SessionSlot, redb::Error> {
    let table = txn.open_table(SESSIONS)?;
    let slot = table.get(key.as_str())?;
    slot.map_or(Ok(SessionSlot::default()), |row| decode(row.value()))
}

pub(super) fn load_lease(txn: &WriteTransaction, partition: u32) -> Result<Lease, redb::Error> {
    let table = txn.open_table(LEASES)?;
    let lease = table.get(partition)?;
    lease.map_or(Ok(Lease::unowned(partition)), |row| decode(row.value()))
}

pub(super) fn store_lease(txn: &WriteTransaction, lease: &Lease) -> Result<(), redb::Error> {
    txn.open_table(LEASES)?
        .insert(lease.partition, encode(lease).as_slice())?;
    Ok(())
}

/// Every entry of the member registry, expired ones included.
pub(super) fn load_members(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<Member>, redb::Error> {
    table.iter()?.map(|row| decode(row?.1.value())).collect()
}

/// The owner check of a write, in the write's own transaction: the writer
/// thread applies lease changes and writes in one order, so a take is after
/// every write of the tenure it ends.
pub(super) fn owner_check(
    txn: &WriteTransaction,
    key: &SessionKey,
    token: Option<&OwnerToken>,
    partitions: u32,
) -> Result<StoreResult<()>, redb::Error> {
    let partition = ownership::partition(key, partitions);
    let lease = load_lease(txn, partition)?;
    Ok(ownership::check_owner(token, partition, &lease))
}

/// What StartRun and FinishRun decide on, after the owner check: the run's
/// record and its session's slot.
pub(super) fn load_run_and_slot(
    txn: &WriteTransaction,
    run_id: &str,
    key: &SessionKey,
    token: Option<&OwnerToken>,
    partitions: u32,
) -> Result<StoreResult<(RunRecord, SessionSlot)>, redb::Error> {
    if let Err(refusal) = owner_check(txn, key, token, partitions)? {
        return Ok(Err(refusal));
    }
    let Some(record) = load_run(&txn.open_table(RUNS)?, run_id)? else {
        return Ok(Err(StoreError::RunNotFound(run_id.to_owned())));
    };
    Ok(Ok((record, load_slot(txn, key)?)))
}

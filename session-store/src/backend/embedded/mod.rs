//! The embedded backend: one redb file, crash-safe, nothing to install.
//!
//! Writes go through one writer thread that commits in groups (`writer`): it
//! takes the writes waiting in its two lanes (admission, leases and member
//! heartbeats first, then the rest, up to `max_batch`), applies them in
//! order inside one write transaction, commits once (fsync) and only then answers each caller. So
//! every acknowledged write is durable, under concurrency one fsync pays for
//! many writes, and admission never queues behind executing runs' writes. A write whose rule refuses it writes nothing
//! and does not disturb the rest of its group; a storage error aborts the
//! whole group and every write in it is answered with that error.
//!
//! Reads use redb read transactions on the blocking pool and see only
//! committed data.
//!
//! Long file: the `SessionStore` impl is one block of the trait's two dozen
//! methods, and a trait impl cannot be split across files; each method is
//! one transaction over the helpers in `tables.rs` (the rows) and `writer.rs` (the group commit).

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, WriteTransaction};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::ownership;
use crate::rules::{self, SessionSlot};
use crate::store::SessionStore;
use clawgate_common::clock::now_ms;

mod tables;
mod writer;
use tables::*;
use writer::{Completion, Job, Lane, WriteQueue, run_writer};

#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The most writes committed together in one transaction.
    pub max_batch: usize,
    /// Writes waiting for the writer thread before callers are held back.
    pub queue_depth: usize,
    /// The partition count; written at the first start, checked at every
    /// later one.
    pub partitions: u32,
    /// The largest settings object of a session (`--max-settings-bytes`).
    pub max_settings_bytes: usize,
    /// The most live entries of the member registry (`--max-members`).
    pub max_members: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        Self {
            max_batch: 256,
            queue_depth: 4096,
            partitions: clawgate_common::partition::DEFAULT_PARTITIONS,
            max_settings_bytes: rules::DEFAULT_MAX_SETTINGS_BYTES,
            max_members: ownership::DEFAULT_MAX_MEMBERS,
        }
    }
}

pub struct EmbeddedStore {
    db: Arc<Database>,
    queue: Arc<WriteQueue>,
    partitions: u32,
    max_settings_bytes: usize,
    max_members: usize,
}

/// Creates the store file readable and writable by its owner only (0600:
/// it holds every transcript); an existing file keeps its mode. redb makes
/// a database in an empty file.
fn create_private(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store file; recovers it after a crash.
    pub async fn open(path: &Path, options: EmbeddedOptions) -> StoreResult<Self> {
        let path = path.to_owned();
        let (partitions, max_settings_bytes) = (options.partitions, options.max_settings_bytes);
        let max_members = options.max_members;
        clawgate_common::partition::check_partitions(partitions).map_err(StoreError::invalid)?;
        let opened = tokio::task::spawn_blocking(move || -> Result<_, redb::Error> {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(redb::StorageError::from)?;
            }
            create_private(&path).map_err(redb::StorageError::from)?;
            let db = Database::create(&path)?;
            let txn = db.begin_write()?;
            txn.open_table(SESSIONS)?;
            txn.open_table(TRANSCRIPTS)?;
            txn.open_table(RUNS)?;
            txn.open_table(LEASES)?;
            txn.open_table(MEMBERS)?;
            let stored = {
                let mut meta = txn.open_table(META)?;
                let stored = meta.get("partition_count")?.map(|v| v.value());
                if stored.is_none() {
                    meta.insert("partition_count", u64::from(partitions))?;
                }
                stored
            };
            txn.commit()?;
            Ok((db, stored))
        })
        .await
        .map_err(StoreError::internal)?;
        let (db, stored) = opened
            .map_err(|e| StoreError::Unavailable(format!("cannot open the embedded store: {e}")))?;
        if let Some(stored) = stored.filter(|s| *s != u64::from(partitions)) {
            return Err(StoreError::invalid(format!(
                "this store was created with {stored} partitions, not {partitions}; the partition count cannot change"
            )));
        }
        let db = Arc::new(db);
        let queue = Arc::new(WriteQueue::new(options.queue_depth));
        let (writer_db, writer_queue) = (db.clone(), queue.clone());
        std::thread::Builder::new()
            .name("session-store-writer".into())
            .spawn(move || run_writer(&writer_db, &writer_queue, options.max_batch.max(1)))
            .map_err(StoreError::internal)?;
        Ok(Self {
            db,
            queue,
            partitions,
            max_settings_bytes,
            max_members,
        })
    }

    /// Runs `op` in the bulk lane (see `writer`).
    async fn write<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&WriteTransaction, i64) -> Result<StoreResult<T>, redb::Error> + Send + 'static,
    {
        self.write_in(Lane::Bulk, op).await
    }

    /// Runs `op` inside a group commit of its lane's turn and returns its
    /// result once the group is durable.
    async fn write_in<T, F>(&self, lane: Lane, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&WriteTransaction, i64) -> Result<StoreResult<T>, redb::Error> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |txn, now| match op(txn, now) {
            Ok(outcome) => {
                let complete: Completion = Box::new(move |committed| {
                    let _ = reply.send(committed.and(outcome));
                });
                (complete, Ok(()))
            }
            Err(storage) => {
                let message = storage.to_string();
                let complete: Completion = Box::new(move |_| {
                    let _ = reply.send(Err(StoreError::Internal(message)));
                });
                (complete, Err(storage))
            }
        });
        self.queue.push(lane, job).await?;
        answer.await.map_err(|_| {
            StoreError::Unavailable("the write was not applied (storage error)".into())
        })?
    }

    async fn read<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<StoreResult<T>, redb::Error> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read()?;
            op(&txn)
        })
        .await
        .map_err(StoreError::internal)?
        .map_err(StoreError::internal)?
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // The writer commits what is queued, then stops.
        self.queue.close();
    }
}

/// Returns early from a write job with the refusal of a rule or a check.
macro_rules! refused {
    ($outcome:expr) => {
        match $outcome {
            Ok(value) => value,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
}

#[async_trait]
impl SessionStore for EmbeddedStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        let partitions = self.partitions;
        self.write(move |txn, now| {
            refused!(owner_check(
                txn,
                &req.key,
                req.owner_token.as_ref(),
                partitions
            )?);
            let mut slot = load_slot(txn, &req.key)?;
            let acquired = rules::acquire(&mut slot, &req, now, Uuid::new_v4);
            if acquired.is_ok() {
                store_slot(txn, &req.key, &slot)?;
            }
            Ok(acquired)
        })
        .await
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let (key, run_id) = (key.clone(), run_id.to_owned());
        let (owner_token, partitions) = (owner_token.cloned(), self.partitions);
        self.write(move |txn, now| {
            refused!(owner_check(txn, &key, owner_token.as_ref(), partitions)?);
            let mut slot = load_slot(txn, &key)?;
            let released = rules::release(&mut slot, &run_id, fence_token, now);
            if released {
                store_slot(txn, &key, &slot)?;
            }
            Ok(Ok(Released {
                released,
                session: slot.view(&key),
            }))
        })
        .await
    }

    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        let partitions = self.partitions;
        self.write(move |txn, now| {
            refused!(owner_check(
                txn,
                &req.key,
                req.owner_token.as_ref(),
                partitions
            )?);
            let mut slot = load_slot(txn, &req.key)?;
            let first_seq = refused!(rules::reserve_append(&mut slot, &req, now));
            let stamped = rules::stamp_entries(&req, first_seq, now);
            insert_entries(txn, req.session_id.as_u128(), &stamped)?;
            store_slot(txn, &req.key, &slot)?;
            Ok(Ok(Appended {
                first_seq,
                last_seq: first_seq + stamped.len() as u64 - 1,
                session: slot.view(&req.key).expect("append checked the session"),
            }))
        })
        .await
    }

    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        self.read(move |txn| {
            let current = read_slot(txn, &query.key)?.view(&query.key);
            let Some((session_id, known_total)) = rules::history_target(current.as_ref(), &query)
            else {
                return Ok(Ok(HistoryPage::default()));
            };
            let sid = session_id.as_u128();
            let table = txn.open_table(TRANSCRIPTS)?;
            let total = match known_total {
                Some(total) => total,
                // An earlier transcript: its last seq is its length.
                None => match table.range((sid, 0)..=(sid, u64::MAX))?.next_back() {
                    Some(row) => row?.0.value().1,
                    None => 0,
                },
            };
            let page = rules::history_page(session_id, total, &query, |lower, upper| {
                table
                    .range((sid, lower)..=(sid, upper))?
                    .map(|row| decode::<TranscriptEntry>(row?.1.value()))
                    .collect::<Result<Vec<_>, redb::Error>>()
            })?;
            Ok(Ok(page))
        })
        .await
    }

    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        let key = key.clone();
        self.read(move |txn| Ok(Ok(read_slot(txn, &key)?.view(&key))))
            .await
    }

    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        // A full scan: the embedded store serves one machine's sessions.
        self.read(move |txn| {
            let table = txn.open_table(SESSIONS)?;
            let mut sessions = Vec::new();
            for row in table.iter()? {
                let (key, slot) = row?;
                let slot: SessionSlot = decode(slot.value())?;
                let key = SessionKey::from_stored(key.value().to_owned());
                if let Some(session) = slot.view(&key).filter(|s| rules::list_matches(s, &query)) {
                    sessions.push(session);
                }
            }
            Ok(Ok(rules::newest_first(sessions, query.limit)))
        })
        .await
    }

    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        let key = key.clone();
        self.write(move |txn, now| {
            let mut slot = load_slot(txn, &key)?;
            let outcome = rules::reset(&mut slot, &key, now, Uuid::new_v4());
            store_slot(txn, &key, &slot)?;
            Ok(Ok(outcome))
        })
        .await
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let key = key.clone();
        self.write(move |txn, _now| {
            let mut slot = load_slot(txn, &key)?;
            let outcome = rules::delete(&mut slot);
            if outcome.deleted {
                store_slot(txn, &key, &slot)?;
            }
            if let (true, Some(old)) = (delete_transcript, outcome.previous_session_id) {
                let sid = old.as_u128();
                txn.open_table(TRANSCRIPTS)?
                    .retain_in((sid, 0)..=(sid, u64::MAX), |_, _| false)?;
            }
            Ok(Ok(outcome))
        })
        .await
    }

    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        let max_settings_bytes = self.max_settings_bytes;
        self.write(move |txn, now| {
            let mut slot = load_slot(txn, &req.key)?;
            let outcome = refused!(rules::patch(
                &mut slot,
                &req,
                now,
                max_settings_bytes,
                Uuid::new_v4
            ));
            store_slot(txn, &req.key, &slot)?;
            Ok(Ok(outcome))
        })
        .await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let partitions = self.partitions;
        self.write_in(Lane::Urgent, move |txn, now| {
            refused!(owner_check(
                txn,
                &new.session_key,
                new.owner_token.as_ref(),
                partitions
            )?);
            let mut runs = txn.open_table(RUNS)?;
            if let Some(existing) = load_run(&runs, &new.run_id)? {
                return Ok(Ok(rules::existing_run(existing, &new)));
            }
            if new.expected_settings.is_some() || new.create_session {
                let mut slot = load_slot(txn, &new.session_key)?;
                // Checked before anything is written: a refusal still
                // commits the group's transaction (with the other jobs).
                if refused!(rules::admit_to_session(&mut slot, &new, now, Uuid::new_v4)) {
                    store_slot(txn, &new.session_key, &slot)?;
                }
            }
            let record = rules::new_run_record(&new, now);
            runs.insert(new.run_id.as_str(), encode(&record).as_slice())?;
            Ok(Ok(CreateRunOutcome {
                created: true,
                record,
                fingerprint_mismatch: false,
            }))
        })
        .await
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let partitions = self.partitions;
        self.write(move |txn, now| {
            let Some(mut record) = load_run(&txn.open_table(RUNS)?, &update.run_id)? else {
                return Ok(Err(StoreError::RunNotFound(update.run_id)));
            };
            let key = SessionKey::from_stored(record.session_key.clone());
            refused!(owner_check(
                txn,
                &key,
                update.owner_token.as_ref(),
                partitions
            )?);
            refused!(rules::update_run(&mut record, &update, now));
            store_run(txn, &record)?;
            let mut slot = load_slot(txn, &key)?;
            let before = slot.clone();
            rules::note_run_status(&mut slot, &record);
            if slot != before {
                store_slot(txn, &key, &slot)?;
            }
            Ok(Ok(record))
        })
        .await
    }

    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        let partitions = self.partitions;
        let (started, history) = self
            .write(move |txn, now| {
                let (mut record, mut slot) = refused!(load_run_and_slot(
                    txn,
                    &req.run_id,
                    &req.key,
                    req.owner_token.as_ref(),
                    partitions
                )?);
                let (acquired, first_seq) = refused!(rules::start_run(
                    &mut record,
                    &mut slot,
                    &req,
                    now,
                    Uuid::new_v4
                ));
                let sid = acquired.session.session_id.as_u128();
                let stamped = rules::stamp(&req.entries, &req.run_id, first_seq, now);
                insert_entries(txn, sid, &stamped)?;
                store_slot(txn, &req.key, &slot)?;
                store_run(txn, &record)?;
                // Decoded by the caller: the writer thread only copies bytes.
                let total = acquired.session.entry_count;
                let history = match rules::start_history_range(first_seq, total, req.history_limit)
                {
                    Some((lower, upper)) => txn
                        .open_table(TRANSCRIPTS)?
                        .range((sid, lower)..=(sid, upper))?
                        .map(|row| Ok(row?.1.value().to_vec()))
                        .collect::<Result<Vec<_>, redb::Error>>()?,
                    None => Vec::new(),
                };
                let started = Started {
                    record,
                    acquired,
                    first_seq,
                    history: Vec::new(),
                };
                Ok(Ok((started, history)))
            })
            .await?;
        let history = history
            .iter()
            .map(|row| decode(row))
            .collect::<Result<_, _>>()
            .map_err(StoreError::internal)?;
        Ok(Started { history, ..started })
    }

    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        let partitions = self.partitions;
        self.write(move |txn, now| {
            let (mut record, mut slot) = refused!(load_run_and_slot(
                txn,
                &req.run_id,
                &req.key,
                req.owner_token.as_ref(),
                partitions
            )?);
            let before = slot.clone();
            let (first_seq, released) =
                refused!(rules::finish_run(&mut record, &mut slot, &req, now));
            if let Some(fence) = req.writer.filter(|_| !req.entries.is_empty()) {
                let stamped = rules::stamp(&req.entries, &req.run_id, first_seq, now);
                insert_entries(txn, fence.session_id.as_u128(), &stamped)?;
            }
            if slot != before {
                store_slot(txn, &req.key, &slot)?;
            }
            store_run(txn, &record)?;
            Ok(Ok(Finished {
                record,
                first_seq,
                released,
            }))
        })
        .await
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let run_id = run_id.to_owned();
        self.read(move |txn| Ok(Ok(load_run(&txn.open_table(RUNS)?, &run_id)?)))
            .await
    }

    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        let owner = owner.map(str::to_owned);
        self.read(move |txn| {
            let table = txn.open_table(RUNS)?;
            let mut runs = Vec::new();
            for row in table.iter()? {
                let record: RunRecord = decode(row?.1.value())?;
                if rules::is_active_for(&record, owner.as_deref()) {
                    runs.push(record);
                }
            }
            Ok(Ok(rules::oldest_first(runs)))
        })
        .await
    }

    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        self.write(move |txn, _now| {
            let mut runs = txn.open_table(RUNS)?;
            let before = runs.len()?;
            let mut undecodable = None;
            runs.retain(|_, row| match serde_json::from_slice::<RunRecord>(row) {
                Ok(record) => !rules::run_expired(&record, ended_before_ms),
                Err(e) => {
                    undecodable = Some(e.to_string());
                    true
                }
            })?;
            if let Some(e) = undecodable {
                return Err(redb::Error::Corrupted(format!(
                    "undecodable run record: {e}"
                )));
            }
            Ok(Ok(before - runs.len()?))
        })
        .await
    }

    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        let targets = ownership::acquire_targets(&req, self.partitions)?;
        self.write_in(Lane::Urgent, move |txn, now| {
            let mut outcomes = Vec::with_capacity(targets.len());
            for partition in targets {
                let mut lease = load_lease(txn, partition)?;
                let taken = ownership::take(&mut lease, &req, now);
                if taken {
                    store_lease(txn, &lease)?;
                }
                outcomes.push((lease, taken));
            }
            Ok(Ok(ownership::grant(outcomes, now)))
        })
        .await
    }

    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        ownership::check_renew(&req, self.partitions)?;
        self.write_in(Lane::Urgent, move |txn, now| {
            let mut outcomes = Vec::with_capacity(req.tokens.len());
            for token in &req.tokens {
                let mut lease = load_lease(txn, token.partition)?;
                let renewed = ownership::renew(&mut lease, token, req.ttl_ms, now);
                if renewed {
                    store_lease(txn, &lease)?;
                }
                outcomes.push((lease, renewed));
            }
            Ok(Ok(ownership::grant(outcomes, now)))
        })
        .await
    }

    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        ownership::check_tokens(&tokens, None, self.partitions)?;
        self.write_in(Lane::Urgent, move |txn, now| {
            let mut released = Vec::new();
            for token in &tokens {
                let mut lease = load_lease(txn, token.partition)?;
                if ownership::release(&mut lease, token, now) {
                    store_lease(txn, &lease)?;
                    released.push(token.partition);
                }
            }
            Ok(Ok(released))
        })
        .await
    }

    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        let partition_count = self.partitions;
        self.read(move |txn| {
            let table = txn.open_table(LEASES)?;
            let mut leases: Vec<Lease> = (0..partition_count).map(Lease::unowned).collect();
            for row in table.iter()? {
                let lease: Lease = decode(row?.1.value())?;
                if let Some(slot) = leases.get_mut(lease.partition as usize) {
                    *slot = lease;
                }
            }
            Ok(Ok(LeaseTable {
                partition_count,
                leases,
                now_ms: now_ms(),
            }))
        })
        .await
    }

    // Registry writes go in the urgent lane, as lease renewals do: a
    // heartbeat that waited behind execution writes could let a live
    // member's entry expire.
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        ownership::check_heartbeat(&req)?;
        let max_members = self.max_members;
        self.write_in(Lane::Urgent, move |txn, now| {
            let mut table = txn.open_table(MEMBERS)?;
            let (mut live, expired) = ownership::split_members(load_members(&table)?, now);
            let entry = refused!(ownership::heartbeat(&mut live, &req, now, max_members));
            for gone in &expired {
                table.remove(gone.member.as_str())?;
            }
            table.insert(entry.member.as_str(), encode(&entry).as_slice())?;
            Ok(Ok(MemberTable {
                members: live,
                now_ms: now,
            }))
        })
        .await
    }

    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        ownership::check_member(member)?;
        let member = member.to_owned();
        self.write_in(Lane::Urgent, move |txn, now| {
            let mut table = txn.open_table(MEMBERS)?;
            let Some(row) = table.remove(member.as_str())? else {
                return Ok(Ok(false));
            };
            let entry: Member = decode(row.value())?;
            Ok(Ok(ownership::is_live(&entry, now)))
        })
        .await
    }

    async fn list_members(&self) -> StoreResult<MemberTable> {
        self.read(move |txn| {
            let entries = load_members(&txn.open_table(MEMBERS)?)?;
            let now = now_ms();
            Ok(Ok(MemberTable {
                members: ownership::split_members(entries, now).0,
                now_ms: now,
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file holds every transcript: only its owner may read it.
    #[cfg(unix)]
    #[tokio::test]
    async fn the_store_file_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.redb");
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await;
        assert!(store.is_ok());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    /// A store file written before sessions had settings opens, and its
    /// sessions read `"{}"` until patched.
    #[tokio::test]
    async fn sessions_written_before_settings_read_empty_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.redb");
        let session_id = Uuid::new_v4();
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut sessions = txn.open_table(SESSIONS).unwrap();
                // A SessionSlot as the store wrote it then.
                let old = serde_json::json!({
                    "last_fence": 3,
                    "current": {
                        "session_id": session_id,
                        "writer": null,
                        "created_at_ms": 1,
                        "updated_at_ms": 2,
                        "label": "old one",
                        "last_run_id": "r",
                        "last_run_status": "ok",
                        "entry_count": 0
                    }
                });
                let old = old.to_string();
                sessions.insert("agent:main:old", old.as_bytes()).unwrap();
            }
            txn.commit().unwrap();
        }
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default())
            .await
            .unwrap();
        let k = SessionKey::parse("old").unwrap();
        let session = store.get_session(&k).await.unwrap().unwrap();
        assert_eq!(session.session_id, session_id);
        assert_eq!(session.settings_json, "{}");
        assert_eq!(session.label.as_deref(), Some("old one"));
        let listed = store.list_sessions(ListQuery {
            limit: 10,
            ..ListQuery::default()
        });
        assert_eq!(listed.await.unwrap()[0].settings_json, "{}");
        let patched = store
            .patch_session(PatchSession {
                key: k.clone(),
                patch_json: r#"{"archived":true}"#.into(),
                create: false,
            })
            .await
            .unwrap();
        assert!(!patched.created);
        assert_eq!(patched.session.settings_json, r#"{"archived":true}"#);
        assert_eq!(patched.session.fence_token, 3);
        let again = store.get_session(&k).await.unwrap().unwrap();
        assert_eq!(again.settings_json, r#"{"archived":true}"#);
    }
}

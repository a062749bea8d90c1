//! An in-memory backend for unit tests and examples. Not durable: never a
//! default.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::ownership::{self, check_owner};
use crate::rules::{self, SessionSlot};
use crate::store::SessionStore;
use clawgate_common::clock::now_ms;

pub struct MemoryStore {
    inner: Mutex<Inner>,
    max_settings_bytes: usize,
    max_members: usize,
}

struct Inner {
    slots: BTreeMap<SessionKey, SessionSlot>,
    transcripts: HashMap<SessionId, Vec<TranscriptEntry>>,
    runs: HashMap<String, RunRecord>,
    /// One per partition, indexed by partition.
    leases: Vec<Lease>,
    /// The member registry, sorted by member id (expired entries stay until
    /// the next heartbeat prunes them).
    members: Vec<Member>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_partitions(clawgate_common::partition::DEFAULT_PARTITIONS)
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_partitions(partitions: u32) -> Self {
        Self {
            inner: Mutex::new(Inner {
                slots: BTreeMap::new(),
                transcripts: HashMap::new(),
                runs: HashMap::new(),
                leases: (0..partitions).map(Lease::unowned).collect(),
                members: Vec::new(),
            }),
            max_settings_bytes: rules::DEFAULT_MAX_SETTINGS_BYTES,
            max_members: ownership::DEFAULT_MAX_MEMBERS,
        }
    }

    /// The largest settings object of a session (`--max-settings-bytes`).
    pub fn with_max_settings_bytes(mut self, max_settings_bytes: usize) -> Self {
        self.max_settings_bytes = max_settings_bytes;
        self
    }

    /// The most live entries of the member registry (`--max-members`).
    pub fn with_max_members(mut self, max_members: usize) -> Self {
        self.max_members = max_members;
        self
    }
}

impl Inner {
    /// The owner check of a write to `key`'s partition.
    fn check_owner(&self, key: &SessionKey, token: Option<&OwnerToken>) -> StoreResult<()> {
        let partition = ownership::partition(key, self.leases.len() as u32);
        check_owner(token, partition, &self.leases[partition as usize])
    }

    /// What StartRun and FinishRun decide on, after the owner check:
    /// copies of the run's record and its session's slot.
    fn run_and_slot(
        &self,
        run_id: &str,
        key: &SessionKey,
        token: Option<&OwnerToken>,
    ) -> StoreResult<(RunRecord, SessionSlot)> {
        self.check_owner(key, token)?;
        let Some(record) = self.runs.get(run_id).cloned() else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        Ok((record, self.slots.get(key).cloned().unwrap_or_default()))
    }

    fn partition_count(&self) -> u32 {
        self.leases.len() as u32
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        let mut inner = self.inner.lock().await;
        inner.check_owner(&req.key, req.owner_token.as_ref())?;
        let slot = inner.slots.entry(req.key.clone()).or_default();
        rules::acquire(slot, &req, now_ms(), Uuid::new_v4)
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let mut inner = self.inner.lock().await;
        inner.check_owner(key, owner_token)?;
        let Some(slot) = inner.slots.get_mut(key) else {
            return Ok(Released {
                released: false,
                session: None,
            });
        };
        let released = rules::release(slot, run_id, fence_token, now_ms());
        Ok(Released {
            released,
            session: slot.view(key),
        })
    }

    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        let mut inner = self.inner.lock().await;
        inner.check_owner(&req.key, req.owner_token.as_ref())?;
        let now = now_ms();
        let slot = inner.slots.entry(req.key.clone()).or_default();
        let first_seq = rules::reserve_append(slot, &req, now)?;
        let session = slot.view(&req.key).expect("append checked the session");
        let stamped = rules::stamp_entries(&req, first_seq, now);
        let last_seq = first_seq + stamped.len() as u64 - 1;
        inner
            .transcripts
            .entry(req.session_id)
            .or_default()
            .extend(stamped);
        Ok(Appended {
            first_seq,
            last_seq,
            session,
        })
    }

    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        let inner = self.inner.lock().await;
        let current = inner.slots.get(&query.key).and_then(|s| s.view(&query.key));
        let Some((session_id, known_total)) = rules::history_target(current.as_ref(), &query)
        else {
            return Ok(HistoryPage::default());
        };
        let transcript = inner
            .transcripts
            .get(&session_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let total = known_total.unwrap_or(transcript.len() as u64);
        rules::history_page(session_id, total, &query, |lower, upper| {
            Ok(transcript[(lower - 1) as usize..upper as usize].to_vec())
        })
    }

    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        let inner = self.inner.lock().await;
        Ok(inner.slots.get(key).and_then(|slot| slot.view(key)))
    }

    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        let inner = self.inner.lock().await;
        let sessions: Vec<Session> = inner
            .slots
            .iter()
            .filter_map(|(key, slot)| slot.view(key))
            .filter(|s| rules::list_matches(s, &query))
            .collect();
        Ok(rules::newest_first(sessions, query.limit))
    }

    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        let mut inner = self.inner.lock().await;
        let slot = inner.slots.entry(key.clone()).or_default();
        Ok(rules::reset(slot, key, now_ms(), Uuid::new_v4()))
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let mut inner = self.inner.lock().await;
        let Some(slot) = inner.slots.get_mut(key) else {
            return Ok(rules::delete(&mut SessionSlot::default()));
        };
        let outcome = rules::delete(slot);
        if let (true, Some(old)) = (delete_transcript, outcome.previous_session_id) {
            inner.transcripts.remove(&old);
        }
        Ok(outcome)
    }

    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        let mut inner = self.inner.lock().await;
        let mut slot = inner.slots.get(&req.key).cloned().unwrap_or_default();
        let outcome = rules::patch(
            &mut slot,
            &req,
            now_ms(),
            self.max_settings_bytes,
            Uuid::new_v4,
        )?;
        inner.slots.insert(req.key, slot);
        Ok(outcome)
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let mut inner = self.inner.lock().await;
        inner.check_owner(&new.session_key, new.owner_token.as_ref())?;
        if let Some(existing) = inner.runs.get(&new.run_id) {
            return Ok(rules::existing_run(existing.clone(), &new));
        }
        let now = now_ms();
        if new.create_session {
            // Checked on a copy: a refusal leaves no session behind.
            let mut slot = inner
                .slots
                .get(&new.session_key)
                .cloned()
                .unwrap_or_default();
            if rules::admit_to_session(&mut slot, &new, now, Uuid::new_v4)? {
                inner.slots.insert(new.session_key.clone(), slot);
            }
        } else {
            rules::check_settings(inner.slots.get(&new.session_key), &new)?;
        }
        let record = rules::new_run_record(&new, now);
        inner.runs.insert(new.run_id.clone(), record.clone());
        Ok(CreateRunOutcome {
            created: true,
            record,
            fingerprint_mismatch: false,
        })
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let mut inner = self.inner.lock().await;
        let Some(key) = inner
            .runs
            .get(&update.run_id)
            .map(|r| r.session_key.clone())
        else {
            return Err(StoreError::RunNotFound(update.run_id));
        };
        let key = SessionKey::from_stored(key);
        inner.check_owner(&key, update.owner_token.as_ref())?;
        let record = inner.runs.get_mut(&update.run_id).expect("looked up above");
        rules::update_run(record, &update, now_ms())?;
        let record = record.clone();
        if let Some(slot) = inner.slots.get_mut(&key) {
            rules::note_run_status(slot, &record);
        }
        Ok(record)
    }

    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        let mut inner = self.inner.lock().await;
        let (mut record, mut slot) =
            inner.run_and_slot(&req.run_id, &req.key, req.owner_token.as_ref())?;
        let now = now_ms();
        let (acquired, first_seq) =
            rules::start_run(&mut record, &mut slot, &req, now, Uuid::new_v4)?;
        let session_id = acquired.session.session_id;
        let transcript = inner.transcripts.entry(session_id).or_default();
        transcript.extend(rules::stamp(&req.entries, &req.run_id, first_seq, now));
        let total = transcript.len() as u64;
        let history = rules::start_history_range(first_seq, total, req.history_limit)
            .map(|(lower, upper)| transcript[(lower - 1) as usize..upper as usize].to_vec())
            .unwrap_or_default();
        inner.slots.insert(req.key.clone(), slot);
        inner.runs.insert(req.run_id.clone(), record.clone());
        Ok(Started {
            record,
            acquired,
            first_seq,
            history,
        })
    }

    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        let mut inner = self.inner.lock().await;
        let (mut record, mut slot) =
            inner.run_and_slot(&req.run_id, &req.key, req.owner_token.as_ref())?;
        let now = now_ms();
        let (first_seq, released) = rules::finish_run(&mut record, &mut slot, &req, now)?;
        if let Some(fence) = req.writer.filter(|_| !req.entries.is_empty()) {
            let stamped = rules::stamp(&req.entries, &req.run_id, first_seq, now);
            inner
                .transcripts
                .entry(fence.session_id)
                .or_default()
                .extend(stamped);
        }
        if slot != SessionSlot::default() {
            inner.slots.insert(req.key.clone(), slot);
        }
        inner.runs.insert(req.run_id.clone(), record.clone());
        Ok(Finished {
            record,
            first_seq,
            released,
        })
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        Ok(self.inner.lock().await.runs.get(run_id).cloned())
    }

    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        let inner = self.inner.lock().await;
        let runs = inner
            .runs
            .values()
            .filter(|r| rules::is_active_for(r, owner))
            .cloned()
            .collect();
        Ok(rules::oldest_first(runs))
    }

    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        let mut inner = self.inner.lock().await;
        let before = inner.runs.len();
        inner
            .runs
            .retain(|_, r| !rules::run_expired(r, ended_before_ms));
        Ok((before - inner.runs.len()) as u64)
    }

    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        let mut inner = self.inner.lock().await;
        let targets = ownership::acquire_targets(&req, inner.partition_count())?;
        let now = now_ms();
        let outcomes = targets
            .into_iter()
            .map(|p| {
                let lease = &mut inner.leases[p as usize];
                let taken = ownership::take(lease, &req, now);
                (lease.clone(), taken)
            })
            .collect();
        Ok(ownership::grant(outcomes, now))
    }

    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        let mut inner = self.inner.lock().await;
        ownership::check_renew(&req, inner.partition_count())?;
        let now = now_ms();
        let outcomes = req
            .tokens
            .iter()
            .map(|token| {
                let lease = &mut inner.leases[token.partition as usize];
                let renewed = ownership::renew(lease, token, req.ttl_ms, now);
                (lease.clone(), renewed)
            })
            .collect();
        Ok(ownership::grant(outcomes, now))
    }

    async fn release_leases(&self, tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        let mut inner = self.inner.lock().await;
        ownership::check_tokens(&tokens, None, inner.partition_count())?;
        let now = now_ms();
        Ok(tokens
            .iter()
            .filter(|t| ownership::release(&mut inner.leases[t.partition as usize], t, now))
            .map(|t| t.partition)
            .collect())
    }

    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        let inner = self.inner.lock().await;
        Ok(LeaseTable {
            partition_count: inner.partition_count(),
            leases: inner.leases.clone(),
            now_ms: now_ms(),
        })
    }

    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        ownership::check_heartbeat(&req)?;
        let mut inner = self.inner.lock().await;
        let now = now_ms();
        let (mut live, _expired) = ownership::split_members(inner.members.clone(), now);
        ownership::heartbeat(&mut live, &req, now, self.max_members)?;
        inner.members = live.clone();
        Ok(MemberTable {
            members: live,
            now_ms: now,
        })
    }

    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        ownership::check_member(member)?;
        let mut inner = self.inner.lock().await;
        let Some(at) = inner.members.iter().position(|m| m.member == member) else {
            return Ok(false);
        };
        Ok(ownership::is_live(&inner.members.remove(at), now_ms()))
    }

    async fn list_members(&self) -> StoreResult<MemberTable> {
        let inner = self.inner.lock().await;
        let now = now_ms();
        Ok(MemberTable {
            members: ownership::split_members(inner.members.clone(), now).0,
            now_ms: now,
        })
    }
}

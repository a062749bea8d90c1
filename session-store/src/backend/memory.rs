//! An in-memory backend for unit tests and examples. Not durable: never a
//! default.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::{self, SessionSlot};
use crate::store::{SessionStore, now_ms};

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    slots: BTreeMap<SessionKey, SessionSlot>,
    transcripts: HashMap<SessionId, Vec<TranscriptEntry>>,
    runs: HashMap<String, RunRecord>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        let mut inner = self.inner.lock().await;
        let slot = inner.slots.entry(req.key.clone()).or_default();
        rules::acquire(slot, &req, now_ms(), Uuid::new_v4)
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
    ) -> StoreResult<Released> {
        let mut inner = self.inner.lock().await;
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

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let mut inner = self.inner.lock().await;
        if let Some(existing) = inner.runs.get(&new.run_id) {
            return Ok(rules::existing_run(existing.clone(), &new));
        }
        let record = rules::new_run_record(&new, now_ms());
        inner.runs.insert(new.run_id.clone(), record.clone());
        Ok(CreateRunOutcome {
            created: true,
            record,
            fingerprint_mismatch: false,
        })
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let mut inner = self.inner.lock().await;
        let Some(record) = inner.runs.get_mut(&update.run_id) else {
            return Err(StoreError::RunNotFound(update.run_id));
        };
        rules::update_run(record, &update, now_ms())?;
        let record = record.clone();
        let key = SessionKey::from_stored(record.session_key.clone());
        if let Some(slot) = inner.slots.get_mut(&key) {
            rules::note_run_status(slot, &record);
        }
        Ok(record)
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
}

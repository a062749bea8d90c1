//! `session.message` events: each message committed to a session's
//! transcript, pushed to the connections that asked for that session with
//! `sessions.messages.subscribe`.
//!
//! The coordinator's run events say when a transcript may have grown (a
//! run started, produced its first output, ended); the feed then reads the
//! store after the last seq it pushed and sends what is new, in seq order.
//! Reading the store, not the run events, is what makes each message go out
//! once, as committed: a run event can repeat after a failover, the
//! transcript cannot. One refresh per session at a time keeps the order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use run_coordinator_api::events::{EventBody, RunEvent};
use serde_json::json;
use session_store_api::model::{HistoryCursor, HistoryQuery, SessionId};
use session_store_api::{SessionKey, SessionStore};

use super::Events;
use crate::protocol::transcript::transcript_message;
use crate::state::Edge;

/// Entries one store read fetches.
const PAGE: u32 = 100;

/// Followed sessions kept before those nobody watches any more are pruned
/// (then again each time the count doubles from what is left).
const PRUNE_FROM: usize = 1024;
/// Runs remembered as started, at most. Forgetting one costs only an extra
/// refresh: a refresh sends what is after the last seq sent, whatever
/// asked for it.
const MAX_STARTED: usize = 10_000;

/// The feed's shared state (in [`Events`]). Bookkeeping only: how many sessions are followed and runs remembered is
/// bounded by pruning, never by refusing a subscription.
#[derive(Default)]
pub struct SessionFeed {
    sessions: Mutex<Followed>,
    /// Runs of followed sessions whose first output has been seen (their
    /// user turn is in).
    started: Mutex<HashSet<String>>,
}

#[derive(Default)]
struct Followed {
    positions: HashMap<String, Arc<tokio::sync::Mutex<Position>>>,
    /// Prune when `positions` grows past this.
    prune_at: usize,
}

/// What has been pushed for one session.
#[derive(Debug, Default)]
struct Position {
    session_id: Option<SessionId>,
    last_seq: u64,
}

impl SessionFeed {
    /// Starts following `key` from its current end (a subscriber reads the
    /// history first; the feed sends what comes after).
    pub async fn follow(&self, edge: &Arc<Edge>, key: &SessionKey) {
        self.prune(edge);
        let position = self.position(key.as_str());
        let mut position = position.lock().await;
        if position.session_id.is_none()
            && let Ok(Some(session)) = edge.backends.store.get_session(key).await
        {
            position.session_id = Some(session.session_id);
            position.last_seq = session.entry_count;
        }
    }

    fn position(&self, key: &str) -> Arc<tokio::sync::Mutex<Position>> {
        self.sessions
            .lock()
            .unwrap()
            .positions
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    /// Drops the sessions no connection watches (their connections closed
    /// or unsubscribed without a run event since), once there are many.
    fn prune(&self, edge: &Edge) {
        let mut followed = self.sessions.lock().unwrap();
        if followed.positions.len() <= followed.prune_at.max(PRUNE_FROM) {
            return;
        }
        let watched: HashSet<String> = edge
            .connections()
            .iter()
            .flat_map(|conn| conn.watched_sessions())
            .collect();
        followed.positions.retain(|key, _| watched.contains(key));
        followed.prune_at = 2 * followed.positions.len();
    }

    /// Sessions followed now (for the tests of its bound).
    pub fn followed(&self) -> usize {
        self.sessions.lock().unwrap().positions.len()
    }

    /// Called for every run event the fanout receives.
    pub fn on_event(&self, edge: &Arc<Edge>, events: &Arc<Events>, event: &RunEvent) {
        let followed = self
            .sessions
            .lock()
            .unwrap()
            .positions
            .contains_key(&event.session_key);
        let grew = match &event.body {
            EventBody::Lifecycle { .. } => {
                self.started.lock().unwrap().remove(&event.run_id);
                true
            }
            EventBody::Assistant { .. } | EventBody::Tool { .. } if followed => {
                let mut started = self.started.lock().unwrap();
                if started.len() >= MAX_STARTED {
                    started.clear();
                }
                started.insert(event.run_id.clone())
            }
            _ => false,
        };
        if !grew || !followed {
            return;
        }
        let (edge, events, key) = (edge.clone(), events.clone(), event.session_key.clone());
        tokio::spawn(async move { events.feed.refresh(&edge, &key).await });
    }

    /// Sends `key`'s entries after the last one sent.
    async fn refresh(&self, edge: &Arc<Edge>, key: &str) {
        let watchers: Vec<_> = edge
            .connections()
            .into_iter()
            .filter(|c| c.watches_messages(key))
            .collect();
        if watchers.is_empty() {
            self.sessions.lock().unwrap().positions.remove(key);
            return;
        }
        let Ok(session_key) = SessionKey::parse(key) else {
            return;
        };
        let position = self.position(key);
        let mut position = position.lock().await;
        loop {
            let page = edge
                .backends
                .store
                .history(HistoryQuery {
                    key: session_key.clone(),
                    limit: PAGE,
                    cursor: HistoryCursor::After(position.last_seq),
                    max_chars: None,
                    session_id: None,
                })
                .await;
            let Ok(page) = page else { return };
            // A reset replaced the transcript: its messages start at 1.
            if page.session_id != position.session_id {
                position.session_id = page.session_id;
                position.last_seq = 0;
                continue;
            }
            let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
            for entry in &page.entries {
                let message = transcript_message(&id, entry);
                let payload = json!({
                    "sessionKey": key, "agentId": "main", "sessionId": id,
                    "message": message, "messageId": message["__openclaw"]["id"],
                    "messageSeq": entry.seq, "runId": entry.run_id,
                });
                for conn in &watchers {
                    conn.outbox.targeted("session.message", &payload, false);
                }
                position.last_seq = entry.seq;
            }
            if !page.has_more || page.entries.is_empty() {
                return;
            }
        }
    }
}

//! What the edge keeps in memory on behalf of its clients: the settings of
//! the sessions it sent to lately ([`SettingsCache`]) and the Control UI's
//! preferences per user ([`UserPrefs`]).
//!
//! The settings cache saves a send the read of its session from the store
//! before every Submit.
//!
//! An entry is never trusted blindly. Submit carries the digest of the
//! settings it was made from, and the store creates the run only if the
//! session still has them (CreateRun's `expected_settings`, in the same
//! transaction as the run record). A change made anywhere (another edge,
//! a direct store client) makes the next send from a stale entry fail with
//! SETTINGS_CHANGED before anything is admitted; the edge then reads the
//! session again and submits again. The cache only saves reads, it cannot
//! make a run use settings older than the ones committed before its
//! admission.
//!
//! Bounded by `--session-settings-cache` entries in two generations: new
//! entries go to the young one; when it is half the bound, it becomes the
//! old one (the previous old one is dropped); a hit in the old generation
//! moves the entry back to the young one. Sessions in use stay, idle ones
//! age out, with no per-entry bookkeeping.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value};
use session_store_api::SessionKey;

use crate::config::QueueMode;

/// What a turn of a session runs with, from its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSettings {
    /// The runtime options: the session's model override (`{}` when none).
    pub options: Value,
    /// The queue mode of a send that names none.
    pub queue_mode: QueueMode,
    /// `settings_digest` of the session's settings; `None`: the session
    /// has no row in the store.
    pub digest: Option<u64>,
}

pub struct SettingsCache {
    /// Entries at most (both generations); 0: nothing is kept.
    capacity: usize,
    generations: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    young: HashMap<SessionKey, TurnSettings>,
    old: HashMap<SessionKey, TurnSettings>,
}

impl SettingsCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            generations: Mutex::default(),
        }
    }

    /// The cached settings of `key`, if any.
    pub fn get(&self, key: &SessionKey) -> Option<TurnSettings> {
        let mut generations = self.generations.lock().unwrap();
        if let Some(found) = generations.young.get(key) {
            return Some(found.clone());
        }
        let found = generations.old.remove(key)?;
        self.insert_young(&mut generations, key.clone(), found.clone());
        Some(found)
    }

    /// Keeps the settings of a session that exists (one without a row is
    /// created before it is sent to, and then read).
    pub fn put(&self, key: &SessionKey, settings: &TurnSettings) {
        if self.capacity == 0 || settings.digest.is_none() {
            return;
        }
        let mut generations = self.generations.lock().unwrap();
        generations.old.remove(key);
        self.insert_young(&mut generations, key.clone(), settings.clone());
    }

    /// Drops `key` (its settings changed here, or the store said they did).
    pub fn forget(&self, key: &SessionKey) {
        let mut generations = self.generations.lock().unwrap();
        generations.young.remove(key);
        generations.old.remove(key);
    }

    fn insert_young(&self, generations: &mut Generations, key: SessionKey, value: TurnSettings) {
        generations.young.insert(key, value);
        if generations.young.len() >= self.capacity.div_ceil(2) {
            generations.old = std::mem::take(&mut generations.young);
        }
    }

    /// Entries held (both generations).
    #[cfg(test)]
    fn len(&self) -> usize {
        let generations = self.generations.lock().unwrap();
        generations.young.len() + generations.old.len()
    }
}

/// Control UI preferences per user (the connection's requester), kept by
/// this edge process (`users.prefs.*`), bounded in users
/// (`EDGE_USER_PREFS_MAX_USERS`) and in bytes of keys and JSON values, all
/// users together (`EDGE_USER_PREFS_MAX_BYTES`).
pub struct UserPrefs {
    max_users: usize,
    max_bytes: usize,
    state: Mutex<Prefs>,
}

#[derive(Default)]
struct Prefs {
    by_user: HashMap<String, Map<String, Value>>,
    bytes: usize,
}

/// What a user's preferences weigh against `EDGE_USER_PREFS_MAX_BYTES`.
fn weight(user: &str, prefs: &Map<String, Value>) -> usize {
    let entries: usize = prefs
        .iter()
        .map(|(k, v)| k.len() + v.to_string().len())
        .sum();
    if entries == 0 {
        0
    } else {
        user.len() + entries
    }
}

impl UserPrefs {
    pub fn new(max_users: usize, max_bytes: usize) -> Self {
        Self {
            max_users,
            max_bytes,
            state: Mutex::default(),
        }
    }

    /// Reads `user`'s preferences (`None`: it has none) under the lock.
    pub fn read<R>(&self, user: &str, read: impl FnOnce(Option<&Map<String, Value>>) -> R) -> R {
        read(self.state.lock().unwrap().by_user.get(user))
    }

    /// Changes `user`'s preferences (empty for a user with none) under the
    /// lock, so a compare-and-set sees no other change between its read and
    /// its write. A change that would take the preferences over a bound is
    /// undone and refused: `Err` says which bound.
    pub fn update<R>(
        &self,
        user: &str,
        update: impl FnOnce(&mut Map<String, Value>) -> R,
    ) -> Result<R, String> {
        let mut state = self.state.lock().unwrap();
        let Prefs { by_user, bytes } = &mut *state;
        let known = by_user.contains_key(user);
        let mine = by_user.entry(user.to_owned()).or_default();
        let before = mine.clone();
        let weighed = weight(user, mine);
        let outcome = update(mine);
        let weighs = weight(user, mine);
        let total = *bytes - weighed + weighs;
        let refusal = if !known && !mine.is_empty() && by_user.len() > self.max_users {
            Some(format!(
                "the gateway keeps preferences for {} users at most (EDGE_USER_PREFS_MAX_USERS)",
                self.max_users
            ))
        } else if weighs > weighed && total > self.max_bytes {
            Some(format!(
                "the gateway keeps {} bytes of preferences at most (EDGE_USER_PREFS_MAX_BYTES)",
                self.max_bytes
            ))
        } else {
            None
        };
        let mine = by_user.get_mut(user).expect("inserted above");
        if refusal.is_some() {
            *mine = before;
        } else {
            *bytes = total;
        }
        if mine.is_empty() {
            by_user.remove(user);
        }
        match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(outcome),
        }
    }

    /// Drops `user`'s preferences (a connection without a device closed:
    /// it was its own user).
    pub fn forget(&self, user: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(prefs) = state.by_user.remove(user) {
            state.bytes -= weight(user, &prefs);
        }
    }

    /// Users with preferences now.
    pub fn users(&self) -> usize {
        self.state.lock().unwrap().by_user.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> SessionKey {
        SessionKey::parse(&format!("agent:main:s{n}")).unwrap()
    }

    fn settings(digest: u64) -> TurnSettings {
        TurnSettings {
            options: serde_json::json!({}),
            queue_mode: QueueMode::Followup,
            digest: Some(digest),
        }
    }

    #[test]
    fn entries_are_bounded_and_the_ones_in_use_stay() {
        let cache = SettingsCache::new(4);
        cache.put(&key(0), &settings(0));
        for n in 1..100 {
            cache.put(&key(n), &settings(n as u64));
            // Session 0 is sent to all along: it never ages out.
            assert_eq!(cache.get(&key(0)), Some(settings(0)));
            assert!(cache.len() <= 4, "{} entries", cache.len());
        }
        assert_eq!(cache.get(&key(1)), None, "an idle session aged out");
        assert_eq!(cache.get(&key(99)), Some(settings(99)));
    }

    #[test]
    fn forgotten_absent_and_disabled_entries_are_not_served() {
        let cache = SettingsCache::new(8);
        cache.put(&key(1), &settings(1));
        cache.forget(&key(1));
        assert_eq!(cache.get(&key(1)), None);
        let absent = TurnSettings {
            digest: None,
            ..settings(0)
        };
        cache.put(&key(2), &absent);
        assert_eq!(cache.get(&key(2)), None);
        let disabled = SettingsCache::new(0);
        disabled.put(&key(3), &settings(3));
        assert_eq!(disabled.len(), 0);
    }
}

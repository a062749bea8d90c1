//! The settings of sessions this edge sent to lately, so that a send need
//! not read its session from the store before every Submit.
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

use session_store_api::SessionKey;

use crate::config::QueueMode;

/// What a turn of a session runs with, from its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSettings {
    /// The runtime options: the session's model override ("" when none).
    pub options_json: String,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> SessionKey {
        SessionKey::parse(&format!("agent:main:s{n}")).unwrap()
    }

    fn settings(digest: u64) -> TurnSettings {
        TurnSettings {
            options_json: String::new(),
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

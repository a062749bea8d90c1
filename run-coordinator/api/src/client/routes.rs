//! Which session a run belongs to, for calls that name only the run
//! (`Get`, `Wait`, `Cancel(run)`, `Subscribe(run)`): a bounded map, learned
//! from Submits and from run events, the oldest entry leaving first.

use std::collections::{HashMap, VecDeque};

use clawgate_proto::run_coordinator::v1 as pb;

/// run id → canonical session key, at most `capacity` entries; when full,
/// the entry learned first goes (first in, first out).
#[derive(Debug, Default)]
pub struct RunRoutes {
    capacity: usize,
    sessions: HashMap<String, String>,
    order: VecDeque<String>,
}

impl RunRoutes {
    /// `capacity` 0: nothing is kept (every run-scoped call asks the store).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            sessions: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Remembers `run_id`'s session (a run never changes session; a known
    /// run keeps its place in the order).
    pub fn learn(&mut self, run_id: &str, session_key: &str) {
        if self.capacity == 0 || run_id.is_empty() || session_key.is_empty() {
            return;
        }
        if let Some(known) = self.sessions.get_mut(run_id) {
            if known != session_key {
                session_key.clone_into(known);
            }
            return;
        }
        while self.sessions.len() >= self.capacity {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.sessions.remove(&oldest);
        }
        self.sessions
            .insert(run_id.to_owned(), session_key.to_owned());
        self.order.push_back(run_id.to_owned());
    }

    pub fn session_of(&self, run_id: &str) -> Option<&str> {
        self.sessions.get(run_id).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

/// Active runs from several coordinators as one list, the way one
/// coordinator lists them: each run once, oldest first (created, then id).
pub(crate) fn merge_active(
    lists: impl IntoIterator<Item = Vec<pb::RunSnapshot>>,
) -> Vec<pb::RunSnapshot> {
    let mut runs: Vec<pb::RunSnapshot> = lists.into_iter().flatten().collect();
    runs.sort_by(|a, b| (a.created_at_ms, &a.run_id).cmp(&(b.created_at_ms, &b.run_id)));
    // A run two coordinators list (it moved between the calls) stays once.
    let mut seen = std::collections::HashSet::new();
    runs.retain(|run| seen.insert(run.run_id.clone()));
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_keeps_at_most_its_capacity_oldest_leaving_first() {
        let mut routes = RunRoutes::new(3);
        for n in 0..3 {
            routes.learn(&format!("r{n}"), &format!("agent:main:s{n}"));
        }
        assert_eq!(routes.len(), 3);
        // Learning a known run again neither grows the map nor moves it.
        routes.learn("r0", "agent:main:s0");
        assert_eq!(routes.len(), 3);
        routes.learn("r3", "agent:main:s3");
        assert_eq!(routes.len(), 3);
        assert_eq!(
            routes.session_of("r0"),
            None,
            "the first learned left first"
        );
        assert_eq!(routes.session_of("r1"), Some("agent:main:s1"));
        assert_eq!(routes.session_of("r3"), Some("agent:main:s3"));
        for n in 4..100 {
            routes.learn(&format!("r{n}"), "agent:main:x");
        }
        assert_eq!(routes.len(), 3);
        assert_eq!(routes.session_of("r99"), Some("agent:main:x"));
        assert_eq!(routes.session_of("r96"), None);
    }

    #[test]
    fn capacity_zero_keeps_nothing_and_empty_names_are_ignored() {
        let mut routes = RunRoutes::new(0);
        routes.learn("r", "agent:main:main");
        assert!(routes.is_empty());
        let mut routes = RunRoutes::new(2);
        routes.learn("", "agent:main:main");
        routes.learn("r", "");
        assert!(routes.is_empty());
    }

    fn run(id: &str, created: i64) -> pb::RunSnapshot {
        pb::RunSnapshot {
            run_id: id.to_owned(),
            created_at_ms: created,
            ..Default::default()
        }
    }

    #[test]
    fn merged_lists_are_ordered_by_creation_then_id_each_run_once() {
        let merged = merge_active([
            vec![run("b", 5), run("z", 9)],
            vec![run("a", 5), run("c", 1), run("b", 5)],
            vec![],
            vec![run("m", 7)],
        ]);
        let ids: Vec<&str> = merged.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["c", "a", "b", "m", "z"]);
    }
}

//! A session's transcript as runs, and the checks every multi-process test
//! makes of it after faults: each run's turns together, once, in the order
//! the client sent the runs, and only runs somebody sent; and each run's
//! turns as its recorded end says (an `ok` run answered once, a `lost` one
//! not at all).

use std::collections::{HashMap, HashSet};

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use tonic::transport::Channel;

/// Consecutive turns of one run: the run and its roles in order.
pub type RunBlock = (String, Vec<String>);

/// `session`'s transcript (its first 1,000 entries), run by run.
pub async fn run_blocks(store: &mut SessionStoreClient<Channel>, session: &str) -> Vec<RunBlock> {
    let history = store
        .history(store_pb::HistoryRequest {
            session_key: session.to_owned(),
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("the store answers History")
        .into_inner();
    let mut blocks: Vec<RunBlock> = Vec::new();
    for entry in &history.entries {
        match blocks.last_mut() {
            Some((run, roles)) if *run == entry.run_id => roles.push(entry.role.clone()),
            _ => blocks.push((entry.run_id.clone(), vec![entry.role.clone()])),
        }
    }
    blocks
}

/// Checks that `blocks` hold only runs of `sent`, each once (its turns not
/// split or repeated), in `sent`'s order, each a user turn and at most one
/// assistant turn.
pub fn check_send_order(blocks: &[RunBlock], sent: &[&str]) -> Result<(), String> {
    check_lane_order(blocks, sent, &HashSet::new())
}

/// `check_send_order` for a lane some runs may jump (`interrupt` runs go
/// first): those must appear at most once, the others in `sent`'s order.
pub fn check_lane_order(
    blocks: &[RunBlock],
    sent: &[&str],
    jumpers: &HashSet<&str>,
) -> Result<(), String> {
    let order: Vec<&str> = blocks.iter().map(|(run, _)| run.as_str()).collect();
    let mut seen = HashSet::new();
    let mut last = None;
    for run in &order {
        let Some(position) = sent.iter().position(|s| s == run) else {
            return Err(format!("a turn of a run nobody sent ({run}): {order:?}"));
        };
        if !seen.insert(*run) {
            return Err(format!("turns of {run} split or repeated: {order:?}"));
        }
        if jumpers.contains(run) {
            continue;
        }
        if last.is_some_and(|last| position <= last) {
            return Err(format!("turns out of lane order at {run}: {order:?}"));
        }
        last = Some(position);
    }
    match blocks
        .iter()
        .find(|(_, roles)| roles != &["user", "assistant"] && roles != &["user"])
    {
        Some((run, roles)) => Err(format!("{run}: turns {roles:?}")),
        None => Ok(()),
    }
}

/// Checks the transcript against the runs' recorded ends: a run that
/// ended `ok` has its user turn and exactly one assistant turn; a run that
/// ended `lost` or `superseded` (its writer gone before it finished) has no
/// assistant turn. `statuses`: the runs to check, by id.
pub fn check_states(
    blocks: &[RunBlock],
    statuses: &HashMap<String, store_pb::RunStatus>,
) -> Result<(), String> {
    use store_pb::RunStatus as S;
    for (run, status) in statuses {
        let roles = blocks
            .iter()
            .find(|(id, _)| id == run)
            .map(|(_, roles)| roles.as_slice())
            .unwrap_or_default();
        let answers = roles.iter().filter(|r| *r == "assistant").count();
        let fits = match status {
            S::Ok => roles == ["user", "assistant"],
            S::Lost | S::Superseded => answers == 0,
            _ => true,
        };
        if !fits {
            return Err(format!("{run} ended {status:?} with turns {roles:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_states_check_refuses_answers_that_do_not_fit_the_end() {
        use store_pb::RunStatus as S;
        let blocks = [
            block("ok", &["user", "assistant"]),
            block("lost", &["user"]),
        ];
        let statuses = |pairs: &[(&str, S)]| -> HashMap<String, S> {
            pairs.iter().map(|(r, s)| (r.to_string(), *s)).collect()
        };
        let fine = statuses(&[("ok", S::Ok), ("lost", S::Lost)]);
        assert!(check_states(&blocks, &fine).is_ok());
        // An ok run without its answer; a lost run with one.
        assert!(check_states(&blocks, &statuses(&[("lost", S::Ok)])).is_err());
        assert!(check_states(&blocks, &statuses(&[("ok", S::Lost)])).is_err());
        assert!(check_states(&blocks, &statuses(&[("absent", S::Ok)])).is_err());
    }

    fn block(run: &str, roles: &[&str]) -> RunBlock {
        (run.into(), roles.iter().map(|r| r.to_string()).collect())
    }

    #[test]
    fn the_check_refuses_what_it_names() {
        let sent = ["a", "b", "c"];
        let good = [block("a", &["user", "assistant"]), block("c", &["user"])];
        assert!(check_send_order(&good, &sent).is_ok());
        let split = [
            block("a", &["user"]),
            block("b", &["user"]),
            block("a", &["assistant"]),
        ];
        assert!(check_send_order(&split, &sent).is_err());
        let reordered = [block("b", &["user"]), block("a", &["user"])];
        assert!(check_send_order(&reordered, &sent).is_err());
        let stranger = [block("x", &["user"])];
        assert!(check_send_order(&stranger, &sent).is_err());
        let doubled = [block("a", &["user", "assistant", "assistant"])];
        assert!(check_send_order(&doubled, &sent).is_err());
        // A jumper may come early, but only once; the others keep order.
        let jumpers: HashSet<&str> = ["c"].into();
        let jumped = [
            block("c", &["user"]),
            block("a", &["user"]),
            block("b", &["user"]),
        ];
        assert!(check_lane_order(&jumped, &sent, &jumpers).is_ok());
        let twice = [
            block("c", &["user"]),
            block("a", &["user"]),
            block("c", &["user"]),
        ];
        assert!(check_lane_order(&twice, &sent, &jumpers).is_err());
        let swapped = [
            block("c", &["user"]),
            block("b", &["user"]),
            block("a", &["user"]),
        ];
        assert!(check_lane_order(&swapped, &sent, &jumpers).is_err());
    }
}

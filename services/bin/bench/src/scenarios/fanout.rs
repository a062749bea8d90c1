//! `fanout`: how long after the first delivery of a run's delta the last
//! watcher has it (see the crate's documentation).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{Target, connect_many, described, within_deadline};
use crate::client::{Arrival, Client, ConnectOptions, READ_ONLY};
use crate::plan::{Plan, Scenario};
use crate::progress::{Progress, Tasks};
use crate::stats::Stats;
use crate::table::{Outcome, Row};

pub async fn measure(plan: &Plan, target: &Target) -> Row {
    let progress = Progress::default();
    let delivered = within_deadline(plan, &progress, deliveries(plan, &progress)).await;
    let (outcome, note) = match delivered.and_then(described) {
        Ok((stats, note)) => (Outcome::Latency(stats), note),
        Err(why) => (Outcome::Failed(why), String::new()),
    };
    target.row(Scenario::Fanout, Some(plan.watchers), outcome, note)
}

async fn deliveries(plan: &Plan, progress: &Progress) -> anyhow::Result<(Stats, String)> {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("{}-fanout-{}-", plan.session_prefix, &tag[..8]);
    let watchers = connect_many(&plan.url, &plan.token, plan.watchers, progress, |_| {
        ConnectOptions {
            scopes: READ_ONLY,
            ..ConnectOptions::default()
        }
    })
    .await?;
    let (mut sender, _) = Client::connect(&plan.url, &plan.token).await?;
    sender.watch(prefix.clone());
    let runs = plan.requests;
    let mut tasks = Tasks::default();
    for (mut watcher, _) in watchers {
        watcher.watch(prefix.clone());
        tasks.spawn(async move {
            watcher.until_ended(runs).await?;
            anyhow::Ok(watcher.deltas)
        });
    }
    let session = format!("{prefix}session");
    let started = Instant::now();
    progress.stage("runs played", runs);
    for n in 0..runs {
        let run_id = format!("{prefix}{n}");
        let send = json!({
            "sessionKey": session, "message": format!("fanout message {n}"),
            "idempotencyKey": run_id, "queueMode": "followup",
        });
        sender.send_run(&run_id, send).await?;
        progress.advance();
    }
    let mut arrivals = vec![std::mem::take(&mut sender.deltas)];
    progress.stage("watchers that saw every run end", tasks.len());
    for deltas in tasks.join().await? {
        arrivals.push(deltas?);
        progress.advance();
    }
    let wall = started.elapsed();
    let events = arrivals[0].len();
    let (samples, missing) = spread(&arrivals, events * plan.watchers);
    let mut note = format!(
        "{} watchers + the sender, {runs} runs, {events} deltas; vs the first arrival",
        plan.watchers
    );
    if missing > 0 {
        note.push_str(&format!("; {missing} deliveries missing (dropped)"));
    }
    Ok((Stats::of(samples, wall), note))
}

/// Each arrival's lateness behind the earliest arrival of the same event
/// (run, seq) at any connection, leaving that earliest one out; and how
/// many of `expected` deliveries are not there.
pub fn spread(arrivals: &[Vec<Arrival>], expected: usize) -> (Vec<Duration>, usize) {
    let mut earliest: HashMap<(u32, u64), Instant> = HashMap::new();
    for arrival in arrivals.iter().flatten() {
        earliest
            .entry((arrival.run, arrival.seq))
            .and_modify(|at| *at = (*at).min(arrival.at))
            .or_insert(arrival.at);
    }
    let mut left_out = HashSet::new();
    let mut samples = Vec::new();
    for arrival in arrivals.iter().flatten() {
        let key = (arrival.run, arrival.seq);
        let first = earliest[&key];
        if arrival.at == first && left_out.insert(key) {
            continue;
        }
        samples.push(arrival.at - first);
    }
    let missing = expected.saturating_sub(samples.len());
    (samples, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_behind_the_first_arrival_which_is_left_out() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let arrival = |run, seq, ms| Arrival {
            run,
            seq,
            at: at(ms),
        };
        let sender = vec![arrival(0, 2, 5), arrival(0, 3, 10)];
        let watcher_a = vec![arrival(0, 2, 3), arrival(0, 3, 12)];
        let watcher_b = vec![arrival(0, 2, 3)];
        let (mut samples, missing) = spread(&[sender, watcher_a, watcher_b], 4);
        samples.sort();
        // seq 2: first at 3 (one of the two left out), then 3 and 5;
        // seq 3: first at 10 (the sender's), then 12.
        let ms: Vec<u64> = samples.iter().map(|d| d.as_millis() as u64).collect();
        assert_eq!(ms, vec![0, 2, 2]);
        assert_eq!(missing, 1);
    }
}

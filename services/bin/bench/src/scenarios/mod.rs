//! The scenarios against one gateway, as table rows (see the crate's
//! documentation for what each measures).

pub mod fanout;
pub mod half_open;
pub mod idle;
pub mod startup;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::time::Instant;

use crate::client::{Client, ConnectOptions};
use crate::plan::{CONNECT_CONCURRENCY, Plan, Scenario};
use crate::progress::{Progress, Tasks};
use crate::stats::Stats;
use crate::table::{Outcome, Row};

/// Where rows were measured: the table's topology and backend columns.
#[derive(Debug, Clone)]
pub struct Target {
    pub topology: String,
    pub backend: String,
}

impl Target {
    pub fn new(topology: impl Into<String>, backend: impl Into<String>) -> Self {
        Self {
            topology: topology.into(),
            backend: backend.into(),
        }
    }

    pub fn row(
        &self,
        scenario: Scenario,
        connections: Option<usize>,
        outcome: Outcome,
        note: impl Into<String>,
    ) -> Row {
        Row {
            scenario,
            topology: self.topology.clone(),
            backend: self.backend.clone(),
            connections,
            outcome,
            note: note.into(),
        }
    }
}

/// Runs the gateway scenarios of `plan` (all but `startup`, which starts
/// its own processes), handing each row to `emit` as soon as it is
/// measured: `idle` first, while the gateway's memory is that of a fresh
/// process; then every looping scenario at every connection count; then
/// `fanout`. A scenario that fails is a row saying so; one still going at
/// its deadline (`plan.scenario_timeout`) is a row of what it measured
/// until then and how far it got.
pub async fn run(plan: &Plan, target: &Target, emit: &(dyn Fn(Row) + Sync)) {
    let started = Instant::now();
    let progress = |what: String| {
        eprintln!(
            "  [{:>6.1} s] {what} on {} ({})",
            started.elapsed().as_secs_f64(),
            target.topology,
            target.backend
        )
    };
    if plan.scenarios.contains(&Scenario::Idle) {
        progress(format!("idle, {} connections", plan.idle));
        emit(idle::measure(plan, target).await);
    }
    if plan.scenarios.contains(&Scenario::HalfOpen) {
        progress(format!("half-open, {} sockets", plan.idle));
        emit(half_open::measure(plan, target).await);
    }
    for &connections in &plan.connections {
        for &scenario in plan.scenarios.iter().filter(|s| s.per_connection_count()) {
            progress(format!("{}, {connections} connections", scenario.key()));
            for row in looping_rows(plan, target, scenario, connections).await {
                emit(row);
            }
        }
    }
    if plan.scenarios.contains(&Scenario::Fanout) {
        progress(format!("fanout, {} watchers", plan.watchers));
        emit(fanout::measure(plan, target).await);
    }
    progress("done".into());
}

/// Runs `work` until `plan`'s deadline for one scenario: its output, or
/// how far it got by then (from `progress`).
pub async fn within_deadline<T>(
    plan: &Plan,
    progress: &Progress,
    work: impl Future<Output = T>,
) -> Result<T, String> {
    tokio::time::timeout(plan.scenario_timeout, work)
        .await
        .map_err(|_| {
            let got = progress.describe();
            let got = if got.is_empty() {
                String::new()
            } else {
                format!(": {got}")
            };
            format!("the {:?} deadline came{got}", plan.scenario_timeout)
        })
}

/// A scenario's error as its row says it (for scenarios whose deadline
/// and error end the same way: a failed row).
pub fn described<T>(done: anyhow::Result<T>) -> Result<T, String> {
    done.map_err(|e| format!("{e:#}"))
}

/// The rows of one looping scenario at one connection count.
async fn looping_rows(
    plan: &Plan,
    target: &Target,
    scenario: Scenario,
    connections: usize,
) -> Vec<Row> {
    let progress = Arc::new(Progress::default());
    let measured = within_deadline(
        plan,
        &progress,
        looping(plan, scenario, connections, &progress),
    );
    let row = |scenario, outcome| target.row(scenario, Some(connections), outcome, "");
    let with_acks = |outcome: &dyn Fn(Stats) -> Outcome| {
        let (main, acks) = progress.stats();
        let mut rows = vec![row(scenario, outcome(main))];
        if scenario == Scenario::Run {
            rows.insert(0, row(Scenario::BusyAck, outcome(acks)));
        }
        rows
    };
    match measured.await {
        Ok(Ok(())) => with_acks(&Outcome::Latency),
        Ok(Err(e)) => vec![row(scenario, Outcome::Failed(format!("{e:#}")))],
        Err(why) => with_acks(&|stats| Outcome::Incomplete(stats, why.clone())),
    }
}

/// Opens `count` connections, [`CONNECT_CONCURRENCY`] handshakes at a
/// time, each as `options(index)` says; each with its handshake time.
/// `progress` counts them.
pub async fn connect_many(
    url: &str,
    token: &str,
    count: usize,
    progress: &Progress,
    options: impl Fn(usize) -> ConnectOptions,
) -> anyhow::Result<Vec<(Client, Duration)>> {
    progress.stage("connections opened", count);
    futures::stream::iter(0..count)
        .map(|index| {
            let options = options(index);
            async move { Client::connect_with(url, token, &options).await }
        })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .inspect_ok(|_| progress.advance())
        .try_collect()
        .await
}

/// One looping scenario at one connection count, its samples (and for
/// `run` those of its ACKs, [`Scenario::BusyAck`]) in `progress`.
async fn looping(
    plan: &Plan,
    scenario: Scenario,
    connections: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    progress.start_load();
    let opened = connect_many(&plan.url, &plan.token, connections, progress, |_| {
        ConnectOptions::default()
    })
    .await?;
    if scenario == Scenario::Connect {
        for (_, took) in &opened {
            progress.sample(started, *took, None);
        }
        // The rate is over the whole burst of handshakes.
        progress.end_load();
        return Ok(());
    }
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let per_connection = plan.warmup + plan.requests;
    progress.stage("requests answered", connections * per_connection);
    progress.start_load();
    // A task per connection, so that reading the events every connection
    // gets is spread over the runtime's threads.
    let mut tasks = Tasks::default();
    for (index, (client, _)) in opened.into_iter().enumerate() {
        let session = format!("{}-{}-{index}", plan.session_prefix, &tag[..8]);
        let requests = plan.warmup..per_connection;
        let progress = progress.clone();
        let sessions = Sessions {
            own: session,
            new_percent: plan.new_sessions,
        };
        tasks.spawn(drive(
            client, scenario, requests, plan.pace, sessions, progress,
        ));
    }
    for done in tasks.join().await? {
        done?;
    }
    Ok(())
}

/// One connection's part of a looping scenario: `counted.end` requests,
/// those before `counted.start` not sampled (warm-up). Each answer counts
/// in `progress`, each counted sample goes there.
async fn drive(
    mut client: Client,
    scenario: Scenario,
    counted: std::ops::Range<usize>,
    pace: Option<Duration>,
    sessions: Sessions,
    progress: Arc<Progress>,
) -> anyhow::Result<()> {
    let session = &sessions.own;
    // Connections start spread over one pace, not all at once.
    let mut next =
        Instant::now() + pace.map_or(Duration::ZERO, |p| p.mul_f64(rand_fraction(session)));
    for n in 0..counted.end {
        if let Some(pace) = pace {
            tokio::time::sleep_until(next).await;
            next = Instant::now() + pace;
        }
        let send = || {
            json!({
                "sessionKey": sessions.of(n), "message": format!("bench message {n}"),
                "idempotencyKey": format!("{session}-{n}"), "queueMode": "followup",
            })
        };
        let sent = Instant::now();
        let (sample, ack) = match scenario {
            Scenario::Health => (client.request("health", json!({})).await?, None),
            // The last send also waits for its run's end (not counted):
            // the connection's runs execute in order, so when it ends every
            // run this connection queued has ended, and the next row does
            // not measure this one's backlog.
            Scenario::Ack if n + 1 == counted.end => {
                let (ack, _ended) = client.send_run(&format!("{session}-{n}"), send()).await?;
                (ack, None)
            }
            Scenario::Ack => (client.request("chat.send", send()).await?, None),
            Scenario::Run => {
                let (ack, ended) = client.send_run(&format!("{session}-{n}"), send()).await?;
                (ended, Some(ack))
            }
            other => unreachable!("{other:?} is not a looping scenario"),
        };
        progress.advance();
        if counted.contains(&n) {
            progress.sample(sent, sample, ack);
        }
    }
    Ok(())
}

/// Which session each send of a connection goes to.
struct Sessions {
    /// The connection's own session.
    own: String,
    /// Percent of sends that go to a session of their own instead.
    new_percent: u8,
}

impl Sessions {
    /// The session of send `n`: a new one for about `new_percent` of the
    /// sends (the same ones on every run of the bench), else the own one.
    fn of(&self, n: usize) -> String {
        let new = match self.new_percent {
            0 => false,
            100.. => true,
            p => rand_fraction(&format!("{}-{n}", self.own)) * 100.0 < f64::from(p),
        };
        if new {
            format!("{}-new-{n}", self.own)
        } else {
            self.own.clone()
        }
    }
}

/// A fraction in [0, 1) that depends on `key` only (where in its pace a
/// connection starts).
fn rand_fraction(key: &str) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % 10_000) as f64 / 10_000.0
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::Sessions;

    fn sessions(new_percent: u8) -> Sessions {
        Sessions {
            own: "bench-1".into(),
            new_percent,
        }
    }

    #[test]
    fn sends_go_to_the_own_session_or_new_ones_by_share() {
        assert!((0..100).all(|n| sessions(0).of(n) == "bench-1"));
        let all_new: HashSet<String> = (0..100).map(|n| sessions(100).of(n)).collect();
        assert_eq!(all_new.len(), 100);
        assert!(!all_new.contains("bench-1"));
        let half = sessions(50);
        let new = (0..1000).filter(|&n| half.of(n) != "bench-1").count();
        assert!((350..650).contains(&new), "{new} of 1000 new");
        // The same sends every time.
        assert!((0..1000).all(|n| half.of(n) == sessions(50).of(n)));
    }
}

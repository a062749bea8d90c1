//! The scenarios against one gateway, as table rows (see the crate's
//! documentation for what each measures).

pub mod fanout;
pub mod idle;
pub mod startup;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::time::Instant;

use crate::client::{Client, ConnectOptions};
use crate::{CONNECT_CONCURRENCY, Outcome, Plan, Row, Scenario, Stats};

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
/// its own processes): `idle` first, while the gateway's memory is that
/// of a fresh process; then every looping scenario at every connection
/// count; then `fanout`. A scenario that fails is a row saying so.
pub async fn run(plan: &Plan, target: &Target) -> Vec<Row> {
    let mut rows = Vec::new();
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
        rows.push(idle::measure(plan, target).await);
    }
    for &connections in &plan.connections {
        for &scenario in plan.scenarios.iter().filter(|s| s.per_connection_count()) {
            progress(format!("{}, {connections} connections", scenario.key()));
            match looping(plan, scenario, connections).await {
                Ok(measured) => rows.extend(measured.into_iter().map(|(scenario, stats)| {
                    target.row(scenario, Some(connections), Outcome::Latency(stats), "")
                })),
                Err(e) => {
                    let outcome = Outcome::Failed(format!("{e:#}"));
                    rows.push(target.row(scenario, Some(connections), outcome, ""));
                }
            }
        }
    }
    if plan.scenarios.contains(&Scenario::Fanout) {
        progress(format!("fanout, {} watchers", plan.watchers));
        rows.push(fanout::measure(plan, target).await);
    }
    progress("done".into());
    rows
}

/// Opens `count` connections, [`CONNECT_CONCURRENCY`] handshakes at a
/// time, each as `options(index)` says; each with its handshake time.
pub async fn connect_many(
    url: &str,
    token: &str,
    count: usize,
    options: impl Fn(usize) -> ConnectOptions,
) -> anyhow::Result<Vec<(Client, Duration)>> {
    futures::stream::iter(0..count)
        .map(|index| {
            let options = options(index);
            async move { Client::connect_with(url, token, &options).await }
        })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .try_collect()
        .await
}

/// One looping scenario at one connection count: its figures, and for
/// `run` also those of its ACKs ([`Scenario::BusyAck`]).
async fn looping(
    plan: &Plan,
    scenario: Scenario,
    connections: usize,
) -> anyhow::Result<Vec<(Scenario, Stats)>> {
    let started = Instant::now();
    let opened = connect_many(&plan.url, &plan.token, connections, |_| {
        ConnectOptions::default()
    })
    .await?;
    if scenario == Scenario::Connect {
        let samples = opened.iter().map(|(_, took)| *took).collect();
        return Ok(vec![(scenario, Stats::of(samples, started.elapsed()))]);
    }
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    // A task per connection, so that reading the events every connection
    // gets is spread over the runtime's threads.
    let tasks: Vec<_> = opened
        .into_iter()
        .enumerate()
        .map(|(index, (client, _))| {
            let session = format!("{}-{}-{index}", plan.session_prefix, &tag[..8]);
            let requests = plan.warmup..plan.warmup + plan.requests;
            tokio::spawn(drive(client, scenario, requests, plan.pace, session))
        })
        .collect();
    let mut samples = Samples::default();
    let mut finished = started;
    for task in tasks {
        let done = task.await??;
        samples.main.extend(done.main);
        samples.acks.extend(done.acks);
        finished = finished.max(done.finished);
    }
    // Up to the last sample, not the last task: `ack`'s tasks then wait
    // for their backlog, which is not part of the rate.
    let wall = finished - started;
    let mut measured = vec![(scenario, Stats::of(samples.main, wall))];
    if scenario == Scenario::Run {
        measured.insert(0, (Scenario::BusyAck, Stats::of(samples.acks, wall)));
    }
    Ok(measured)
}

/// One connection's samples: the scenario's, and the ACKs of `run`.
struct Samples {
    main: Vec<Duration>,
    acks: Vec<Duration>,
    /// When the last sample was taken.
    finished: Instant,
}

impl Default for Samples {
    fn default() -> Self {
        Self {
            main: Vec::new(),
            acks: Vec::new(),
            finished: Instant::now(),
        }
    }
}

/// One connection's part of a looping scenario: `counted.end` requests,
/// those before `counted.start` not sampled (warm-up).
async fn drive(
    mut client: Client,
    scenario: Scenario,
    counted: std::ops::Range<usize>,
    pace: Option<Duration>,
    session: String,
) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    // Connections start spread over one pace, not all at once.
    let mut next =
        Instant::now() + pace.map_or(Duration::ZERO, |p| p.mul_f64(rand_fraction(&session)));
    for n in 0..counted.end {
        if let Some(pace) = pace {
            tokio::time::sleep_until(next).await;
            next = Instant::now() + pace;
        }
        let send = || {
            json!({
                "sessionKey": session, "message": format!("bench message {n}"),
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
        if counted.contains(&n) {
            samples.main.push(sample);
            samples.acks.extend(ack);
            samples.finished = sent + sample;
        }
    }
    Ok(samples)
}

/// A fraction in [0, 1) that depends on `key` only (where in its pace a
/// connection starts).
fn rand_fraction(key: &str) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % 10_000) as f64 / 10_000.0
}

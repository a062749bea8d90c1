//! Load scenarios against an OpenClaw-protocol gateway, each at several
//! connection counts, with latency percentiles and rates:
//!
//! - `connect`: socket open → `hello-ok`, 16 handshakes at a time;
//! - `health`: `health` round trips, each connection in a loop;
//! - `ack`: `chat.send` → its ACK, each connection on its own session, runs
//!   executing meanwhile (each send a followup turn of the connection's
//!   session);
//! - `run`: `chat.send` → the run's `chat` final (a complete run).
//!
//! Nothing here knows clawgate: `--url` and `--token` point it at any
//! gateway that speaks the protocol.

pub mod client;

use std::time::Duration;

use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::time::Instant;

use client::Client;

/// Handshakes in progress at once.
const CONNECT_CONCURRENCY: usize = 16;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub url: String,
    pub token: String,
    pub scenarios: Vec<Scenario>,
    pub connections: Vec<usize>,
    /// Operations per connection in the looping scenarios.
    pub requests: usize,
    /// Prefix of the session keys (one session per connection).
    pub session_prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Connect,
    Health,
    Ack,
    Run,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [Self::Connect, Self::Health, Self::Ack, Self::Run];

    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Health => "health",
            Self::Ack => "chat.send ack",
            Self::Run => "complete run",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "connect" => Some(Self::Connect),
            "health" => Some(Self::Health),
            "ack" => Some(Self::Ack),
            "run" => Some(Self::Run),
            _ => None,
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: Scenario,
    pub connections: usize,
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Operations per second over the scenario's wall time.
    pub rate: f64,
}

impl Row {
    fn new(
        scenario: Scenario,
        connections: usize,
        mut samples: Vec<Duration>,
        wall: Duration,
    ) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            samples
                .get(((samples.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        Self {
            scenario,
            connections,
            count: samples.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or_default(),
            rate: samples.len() as f64 / wall.as_secs_f64().max(f64::EPSILON),
        }
    }
}

/// Runs every scenario of `plan` at every connection count, in order.
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &connections in &plan.connections {
        for &scenario in &plan.scenarios {
            rows.push(run_one(plan, scenario, connections).await?);
        }
    }
    Ok(rows)
}

async fn run_one(plan: &Plan, scenario: Scenario, connections: usize) -> anyhow::Result<Row> {
    let started = Instant::now();
    // A gateway limits the sockets one address may have mid-handshake (the
    // edge's --preauth-per-ip, 32): open them a batch at a time.
    let opened: Vec<(Client, Duration)> = futures::stream::iter(0..connections)
        .map(|_| Client::connect(&plan.url, &plan.token))
        .buffer_unordered(CONNECT_CONCURRENCY)
        .try_collect()
        .await?;
    if scenario == Scenario::Connect {
        let samples = opened.iter().map(|(_, took)| *took).collect();
        return Ok(Row::new(scenario, connections, samples, started.elapsed()));
    }
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let per_connection = opened.into_iter().enumerate().map(|(index, (client, _))| {
        let session = format!("{}-{}-{index}", plan.session_prefix, &tag[..8]);
        drive(client, scenario, plan.requests, session)
    });
    let samples: Vec<Duration> = try_join_all(per_connection)
        .await?
        .into_iter()
        .flatten()
        .collect();
    Ok(Row::new(scenario, connections, samples, started.elapsed()))
}

/// One connection's part of a looping scenario.
async fn drive(
    mut client: Client,
    scenario: Scenario,
    requests: usize,
    session: String,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(requests);
    for n in 0..requests {
        let send = || {
            json!({
                "sessionKey": session, "message": format!("bench message {n}"),
                "idempotencyKey": format!("{session}-{n}"), "queueMode": "followup",
            })
        };
        samples.push(match scenario {
            Scenario::Health => client.request("health", json!({})).await?.1,
            Scenario::Ack => client.request("chat.send", send()).await?.1,
            Scenario::Run => {
                let started = Instant::now();
                client.request("chat.send", send()).await?;
                client
                    .until_chat_end(&format!("{session}-{n}"), started)
                    .await?
            }
            Scenario::Connect => unreachable!("connect is measured at open"),
        });
    }
    Ok(samples)
}

/// The rows as a table.
pub fn table(rows: &[Row]) -> String {
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let mut out = String::from(
        "| scenario | connections | count | p50 ms | p90 ms | p99 ms | max ms | per second |\n|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            row.scenario.name(),
            row.connections,
            row.count,
            ms(row.p50),
            ms(row.p90),
            ms(row.p99),
            ms(row.max),
            row.rate
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_of_the_sorted_samples() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let row = Row::new(Scenario::Health, 1, samples, Duration::from_secs(2));
        assert_eq!(row.p50, Duration::from_millis(50));
        assert_eq!(row.p90, Duration::from_millis(90));
        assert_eq!(row.p99, Duration::from_millis(99));
        assert_eq!(row.max, Duration::from_millis(100));
        assert_eq!(row.count, 100);
        assert!((row.rate - 50.0).abs() < 1e-9);
    }
}

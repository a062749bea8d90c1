//! `idle`: the gateway's resident memory per idle authenticated
//! connection (see the crate's documentation).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::{Target, described, within_deadline};
use crate::client::{Client, ConnectOptions, READ_ONLY, resolve};
use crate::http;
use crate::plan::{CONNECT_CONCURRENCY, Plan, Scenario};
use crate::procs::{open_files_limit, vm_rss_kib};
use crate::progress::{Progress, Tasks};
use crate::table::{Memory, Outcome, Row};

/// Local addresses the sockets to a loopback gateway come from, in turn.
const SOURCES: std::ops::RangeInclusive<u8> = 2..=9;
/// Sockets the bench and the gateway need besides the idle ones.
const FD_MARGIN: u64 = 200;
/// How long the presence broadcasts of the burst may take to arrive, and
/// the gateway to close the sockets after.
const SETTLE: Duration = Duration::from_secs(60);
/// A burst is over when no presence list arrived for this long (a gateway
/// that sends none on a connect, as one that gives the newcomer the list in
/// its `hello-ok` and tells the others only of departures).
const QUIET: Duration = Duration::from_secs(1);

pub async fn measure(plan: &Plan, target: &Target) -> Row {
    let progress = Progress::default();
    let held = within_deadline(plan, &progress, hold(plan, &progress)).await;
    memory_row(plan, target, Scenario::Idle, held)
}

/// The row of a memory scenario from what its hold came to.
pub(super) fn memory_row(
    plan: &Plan,
    target: &Target,
    scenario: Scenario,
    held: Result<anyhow::Result<(Memory, String)>, String>,
) -> Row {
    let (outcome, note) = match held.and_then(described) {
        Ok((memory, note)) => (Outcome::Memory(memory), note),
        Err(why) => (Outcome::Failed(why), String::new()),
    };
    target.row(scenario, Some(plan.idle), outcome, note)
}

/// The limits on open files of the bench and of `pid`, for messages.
fn limits(pid: u32) -> String {
    let show = |limit: std::io::Result<(u64, u64)>| match limit {
        Ok((soft, hard)) => format!("{soft} (hard {hard})"),
        Err(_) => "unknown".into(),
    };
    format!(
        "RLIMIT_NOFILE: bench {}, gateway {}",
        show(open_files_limit(None)),
        show(open_files_limit(Some(pid)))
    )
}

/// The source addresses for sockets to `url`: loopback aliases when the
/// gateway is on IPv4 loopback, else none (the system picks).
pub(super) async fn sources(url: &str) -> Vec<Option<IpAddr>> {
    match resolve(url, None).await {
        Ok(address) if address.ip().is_loopback() && address.is_ipv4() => SOURCES
            .map(|n| Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))))
            .collect(),
        _ => vec![None],
    }
}

/// Refuses to open `wanted` sockets that the bench's or the gateway's
/// (`pid`) descriptor limit cannot hold.
pub(super) fn check_open_files(wanted: usize, pid: u32) -> anyhow::Result<()> {
    for (whose, limit) in [
        ("the bench", open_files_limit(None)),
        ("the gateway", open_files_limit(Some(pid))),
    ] {
        if let Ok((soft, hard)) = limit
            && wanted as u64 + FD_MARGIN > soft
        {
            anyhow::bail!(
                "{wanted} sockets need as many in {whose}, whose RLIMIT_NOFILE \
                 is {soft} (hard {hard}; raising the hard limit needs privileges)"
            );
        }
    }
    Ok(())
}

async fn hold(
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<(crate::scenarios::idle::Memory, String)> {
    let pid = plan
        .edge_pid
        .ok_or_else(|| anyhow::anyhow!("no gateway process to read VmRSS of (give --edge-pid)"))?;
    let wanted = plan.idle;
    check_open_files(wanted, pid)?;
    let gauge_before = http::connections_open(&plan.url).await;
    let before_kib = vm_rss_kib(pid)?;
    let sources = sources(&plan.url).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let marker = format!("bench-idle-{}-", &tag[..8]);
    // For each connection: 1 + the highest connection number it has seen
    // in a presence list (0: none yet).
    let seen: Arc<Vec<AtomicUsize>> = Arc::new((0..wanted).map(|_| AtomicUsize::new(0)).collect());
    // When the last presence list arrived anywhere (ms after the start).
    let last_list = Arc::new(AtomicU64::new(0));
    let mut opening = futures::stream::iter(0..wanted)
        .map(|index| {
            let options = ConnectOptions {
                scopes: READ_ONLY,
                source: sources[index % sources.len()],
                instance_id: Some(format!("{marker}{index}")),
            };
            let url = plan.url.clone();
            let token = plan.token.clone();
            async move { (index, Client::connect_with(&url, &token, &options).await) }
        })
        .buffer_unordered(CONNECT_CONCURRENCY);
    let opening_started = Instant::now();
    let since_start = move || opening_started.elapsed().as_millis() as u64;
    let mut readers = Tasks::default();
    let mut failure = None;
    progress.stage("idle connections opened", wanted);
    while let Some((index, opened)) = opening.next().await {
        match opened {
            Ok((client, _)) => {
                progress.advance();
                let (seen, marker, last_list) = (seen.clone(), marker.clone(), last_list.clone());
                readers.spawn(client.idle(move |text| {
                    if !is_presence(text) {
                        return;
                    }
                    last_list.fetch_max(since_start(), Ordering::Relaxed);
                    if let Some(highest) = highest_listed(text, &marker) {
                        seen[index].fetch_max(highest + 1, Ordering::Relaxed);
                    }
                }));
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    drop(opening);
    let opened = readers.len();
    let opening_took = opening_started.elapsed();
    let result = match failure {
        Some(e) => Err(anyhow::anyhow!(
            "opened {opened} of {wanted} idle connections, then: {e:#} ({})",
            limits(pid)
        )),
        None => {
            // Every connection has seen the list that names the last one
            // opened (the highest number: the last one started), or no
            // list came for a while.
            let deadline = Instant::now() + SETTLE;
            let opened_at = since_start();
            let (behind, quiet) = loop {
                let behind = (0..opened)
                    .filter(|&i| seen[i].load(Ordering::Relaxed) < wanted)
                    .count();
                let last = last_list.load(Ordering::Relaxed).max(opened_at);
                let quiet = since_start().saturating_sub(last) >= QUIET.as_millis() as u64;
                if behind == 0 || quiet || Instant::now() > deadline {
                    break (behind, quiet);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let settling = opening_started.elapsed() - opening_took;
            let after_kib = vm_rss_kib(pid)?;
            let memory = Memory {
                opened,
                before_kib,
                after_kib,
            };
            let settled = match (behind, quiet) {
                (0, _) => "each had the last presence list".to_owned(),
                (_, true) => format!("no presence list for {QUIET:?}"),
                (behind, false) => {
                    format!("{behind} never had the last presence list (waited {SETTLE:?})")
                }
            };
            let note = format!(
                "gateway VmRSS {:.1} → {:.1} MiB: {:.2} KiB per connection; opened in {:.1} s, \
                 then {:.1} s until {settled}",
                before_kib as f64 / 1024.0,
                after_kib as f64 / 1024.0,
                memory.per_connection_kib(),
                opening_took.as_secs_f64(),
                settling.as_secs_f64(),
            );
            Ok((memory, note))
        }
    };
    drop(readers);
    // Later scenarios start once the gateway has let these go.
    if let Some(before) = gauge_before {
        let deadline = Instant::now() + SETTLE;
        while http::connections_open(&plan.url)
            .await
            .is_some_and(|open| open > before)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    result
}

fn is_presence(text: &str) -> bool {
    text.contains(r#""event":"presence""#)
}

/// The highest `N` of `marker` + `N` in a presence event, if any.
fn highest_listed(text: &str, marker: &str) -> Option<usize> {
    if !is_presence(text) {
        return None;
    }
    text.match_indices(marker)
        .filter_map(|(at, _)| {
            let digits: String = text[at + marker.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_highest_listed_connection_of_presence_events() {
        let presence = r#"{"type":"event","event":"presence","payload":{"presence":[{"instanceId":"m-3"},{"instanceId":"m-12"},{"instanceId":"other-99"}]},"seq":4}"#;
        assert_eq!(highest_listed(presence, "m-"), Some(12));
        let tick = r#"{"type":"event","event":"tick","payload":{"instanceId":"m-40"}}"#;
        assert_eq!(highest_listed(tick, "m-"), None);
    }

    #[test]
    fn memory_is_per_connection() {
        let memory = Memory {
            opened: 4,
            before_kib: 100,
            after_kib: 110,
        };
        assert!((memory.per_connection_kib() - 2.5).abs() < 1e-9);
    }
}

//! Clients that keep a session busy through faults, and what they saw: each
//! sends one turn after another (`followup`), retrying every turn with its
//! idempotency key through whichever edge answers until it sees the turn's
//! end. The [`Journal`] records every run a client sent, whether an ACK
//! came and how it ended, and which acknowledged run is in flight now.
//!
//! [`Journal::check`] holds the system to its promises afterwards: no run
//! executed twice (the runtime counts), no acknowledged run without a
//! record, every record terminal, every run a client saw finish `ok`, each
//! session's transcript in send order with each run's turns together and
//! once, an `ok` run answered once and a `lost` or `superseded` one not at
//! all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use tonic::transport::Channel;

use crate::records::{is_terminal, run_record};
use crate::transcript::{check_send_order, check_states, run_blocks};
use crate::turns::{Link, send};
use crate::wait::Pacer;

/// How a client saw one of its runs.
#[derive(Debug, Clone)]
pub struct Sent {
    pub run_id: String,
    /// An ACK (`ok: true`) came for it.
    pub acknowledged: bool,
    /// The run's end as the client saw it (`final`, `error`, `aborted`).
    pub ended: String,
}

/// What the clients did.
#[derive(Default)]
pub struct Journal {
    /// Every run that ended, by session, in send order.
    runs: Mutex<HashMap<String, Vec<Sent>>>,
    /// Per session, the run being sent now and whether it was
    /// acknowledged yet.
    in_flight: Mutex<HashMap<String, (String, bool)>>,
    /// Attempts that failed and were retried.
    pub retries: AtomicUsize,
}

impl Journal {
    /// The runs acknowledged and not yet seen ending.
    pub fn acknowledged_in_flight(&self) -> Vec<String> {
        let in_flight = self.in_flight.lock().unwrap();
        in_flight
            .values()
            .filter(|(_, acked)| *acked)
            .map(|(run, _)| run.clone())
            .collect()
    }

    /// How many runs ended so far, all sessions.
    pub fn ended(&self) -> usize {
        self.runs.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Every ended run, by session.
    pub fn runs(&self) -> HashMap<String, Vec<Sent>> {
        self.runs.lock().unwrap().clone()
    }

    fn sending(&self, session: &str, run_id: &str, acked: bool) {
        let entry = (run_id.to_owned(), acked);
        self.in_flight
            .lock()
            .unwrap()
            .insert(session.to_owned(), entry);
    }

    fn ended_one(&self, session: &str, sent: Sent) {
        self.in_flight.lock().unwrap().remove(session);
        let mut runs = self.runs.lock().unwrap();
        runs.entry(session.to_owned()).or_default().push(sent);
    }

    /// Checks every promise (see the module's comment) against the store
    /// and the runtime's execution counts; panics naming the first one
    /// broken. The summary is for the test's report.
    pub async fn check(
        &self,
        store: &mut SessionStoreClient<Channel>,
        executions: &HashMap<String, u32>,
    ) -> Summary {
        let duplicates: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            duplicates.is_empty(),
            "runs executed more than once: {duplicates:?}"
        );
        let mut summary = Summary::default();
        let mut lost_acks = Vec::new();
        for (session, sent) in self.runs() {
            let mut statuses = HashMap::new();
            for run in &sent {
                summary.runs += 1;
                let Some(record) = run_record(store, &run.run_id).await else {
                    if run.acknowledged {
                        lost_acks.push(run.run_id.clone());
                    }
                    continue;
                };
                let status = record.status();
                *summary.statuses.entry(format!("{status:?}")).or_default() += 1;
                assert!(
                    is_terminal(status),
                    "{}: not terminal ({status:?})",
                    run.run_id
                );
                if run.ended == "final" {
                    let id = &run.run_id;
                    assert_eq!(
                        status,
                        store_pb::RunStatus::Ok,
                        "{id}: the client saw it finish"
                    );
                }
                statuses.insert(run.run_id.clone(), status);
            }
            let blocks = run_blocks(store, &session).await;
            let order: Vec<&str> = sent.iter().map(|r| r.run_id.as_str()).collect();
            if let Err(e) = check_send_order(&blocks, &order) {
                panic!("{session}: {e}");
            }
            if let Err(e) = check_states(&blocks, &statuses) {
                panic!("{session}: the transcript does not fit the runs' ends: {e}");
            }
        }
        assert!(
            lost_acks.is_empty(),
            "acknowledged runs without a record: {lost_acks:?}"
        );
        summary.retries = self.retries.load(Ordering::Relaxed);
        summary
    }
}

/// What [`Journal::check`] counted.
#[derive(Debug, Default)]
pub struct Summary {
    pub runs: usize,
    pub retries: usize,
    /// Records by status.
    pub statuses: HashMap<String, usize>,
}

/// A session's client: one run after another until `stop`, each retried
/// (same key, any edge, starting at `first_edge`) until the client saw its
/// end, for at most `patience` per run.
pub async fn client(
    session: String,
    first_edge: usize,
    urls: Arc<Mutex<Vec<String>>>,
    journal: Arc<Journal>,
    stop: Arc<AtomicBool>,
    patience: Duration,
) -> Result<(), String> {
    let mut link = Link::new(urls, first_edge);
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let run_id = format!("{session}-{i}");
        let mut acked = false;
        journal.sending(&session, &run_id, false);
        // A loop, not `poll`: this runs in a spawned task.
        let mut pacer = Pacer::new(format!("{run_id} to end"), patience);
        let ended = loop {
            let result = match link.conn().await {
                Ok(open) => match send(open, &session, &run_id, "followup", &mut acked).await {
                    Ok(answer) if answer == "accepted" => {
                        journal.sending(&session, &run_id, true);
                        open.end_of(&run_id).await
                    }
                    other => other,
                },
                Err(error) => Err(format!("no edge answered ({error})")),
            };
            match result {
                Ok(ended) => break ended,
                Err(error) => {
                    link.failed();
                    journal.retries.fetch_add(1, Ordering::Relaxed);
                    pacer.pause(Some(error)).await.map_err(|e| e.to_string())?;
                }
            }
        };
        let sent = Sent {
            run_id,
            acknowledged: acked,
            ended,
        };
        journal.ended_one(&session, sent);
    }
    unreachable!("the loop only returns")
}

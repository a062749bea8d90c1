//! Races through the gRPC server: many tasks take the writer slot over,
//! append and reset one session at once. Afterwards the transcripts must show
//! that only the fence holder of the moment ever wrote, with gapless seqs, and
//! that every acknowledged append is there.

mod suite;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use session_store::SessionStore;
use session_store::model::*;
use suite::harness::{self, Harness, TestServer};
use suite::key;

const TASKS: usize = 32;
const RACE_FOR: Duration = Duration::from_secs(2);
/// A bound so a broken store fails the test instead of hanging it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// A successful AcquireWriter as its caller saw it.
#[derive(Debug, Clone)]
struct Grant {
    run_id: String,
    session_id: SessionId,
    /// Entries in that transcript when the fence was issued.
    entries_at_grant: u64,
}

/// An acknowledged Append.
#[derive(Debug, Clone)]
struct Ack {
    session_id: SessionId,
    first_seq: u64,
    tags: Vec<String>,
}

#[derive(Default)]
struct Journal {
    grants: BTreeMap<u64, Grant>,
    acks: Vec<Ack>,
    resets: Vec<SessionId>,
}

/// A small deterministic generator so every run mixes operations the same way.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

impl Journal {
    /// The race has run long enough: at least `RACE_FOR`, and enough of each
    /// operation happened for the checks to mean something.
    fn enough(&self, started: Instant) -> bool {
        started.elapsed() >= RACE_FOR
            && self.grants.len() >= 64
            && self.acks.len() >= 200
            && self.resets.len() >= 4
    }
}

async fn racer(
    task: usize,
    store: Arc<dyn SessionStore>,
    journal: Arc<Mutex<Journal>>,
    started: Instant,
) {
    let k = key("race");
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (task as u64 + 1));
    let mut held: Option<Acquired> = None;
    let mut round = 0u64;
    while !journal.lock().unwrap().enough(started) {
        assert!(
            started.elapsed() < GIVE_UP_AFTER,
            "the race made too little progress"
        );
        round += 1;
        // Per mille: a few resets and takeovers; otherwise the fence holder
        // appends and the others idle briefly, so writers are superseded
        // often but also get to write in between.
        let roll = rng.next() % 1000;
        if roll < 3 {
            let out = store.reset_session(&k).await.expect("reset");
            if let Some(old) = out.previous_session_id {
                journal.lock().unwrap().resets.push(old);
            }
        } else if roll < 10 {
            let run_id = format!("t{task}-r{round}");
            let req = suite::acquire_req(&k, &run_id, None, AcquireMode::Takeover);
            let got = store
                .acquire_writer(req)
                .await
                .expect("takeover never conflicts");
            journal.lock().unwrap().grants.insert(
                got.fence_token,
                Grant {
                    run_id,
                    session_id: got.session.session_id,
                    entries_at_grant: got.session.entry_count,
                },
            );
            held = Some(got);
        } else if let Some(grant) = &held {
            let run_id = grant.session.active_writer_run_id.clone().unwrap();
            let count = 1 + (rng.next() % 3) as usize;
            let tags: Vec<String> = (0..count)
                .map(|i| format!("{run_id}/f{}/{i}", grant.fence_token))
                .collect();
            let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
            match store
                .append(suite::append_req(&k, grant, &run_id, &tag_refs))
                .await
            {
                Ok(done) => journal.lock().unwrap().acks.push(Ack {
                    session_id: grant.session.session_id,
                    first_seq: done.first_seq,
                    tags,
                }),
                Err(e) => {
                    assert!(
                        matches!(e.code(), "STALE_WRITER" | "SESSION_REPLACED"),
                        "unexpected append error: {e:?}"
                    );
                    held = None;
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The fence a tag was written with (`<run>/f<fence>/<i>`).
fn fence_of(tag: &str) -> u64 {
    tag.split('/').nth(1).unwrap()[1..].parse().unwrap()
}

async fn race(harness: Harness) {
    let server = TestServer::start(harness.shared(), Default::default()).await;
    // A few connections, as several coordinator replicas would have.
    let mut remotes = Vec::new();
    for _ in 0..4 {
        remotes.push(Arc::new(server.remote().await) as Arc<dyn SessionStore>);
    }
    let journal = Arc::new(Mutex::new(Journal::default()));
    let started = Instant::now();
    let racers: Vec<_> = (0..TASKS)
        .map(|task| {
            tokio::spawn(racer(
                task,
                remotes[task % remotes.len()].clone(),
                journal.clone(),
                started,
            ))
        })
        .collect();
    for racer in racers {
        racer.await.unwrap();
    }
    let journal = std::mem::take(&mut *journal.lock().unwrap());
    let store = harness.store();

    let mut session_ids: Vec<SessionId> = journal.grants.values().map(|g| g.session_id).collect();
    session_ids.extend(journal.resets.iter().copied());
    session_ids.sort();
    session_ids.dedup();
    let mut written: HashMap<SessionId, Vec<TranscriptEntry>> = HashMap::new();
    for id in session_ids {
        written.insert(id, suite::transcript(store, &key("race"), Some(id)).await);
    }

    let mut total_entries = 0;
    for (session_id, entries) in &written {
        total_entries += entries.len();
        let mut last_fence = 0;
        for (index, entry) in entries.iter().enumerate() {
            assert_eq!(entry.seq, index as u64 + 1, "seq has a gap or a duplicate");
            let tag = suite::text_of(entry);
            let fence = fence_of(&tag);
            let grant = journal
                .grants
                .get(&fence)
                .unwrap_or_else(|| panic!("entry {tag} uses fence {fence} that was never issued"));
            assert_eq!(
                entry.run_id, grant.run_id,
                "{tag}: written by a run that did not hold fence {fence}"
            );
            assert_eq!(
                *session_id, grant.session_id,
                "{tag}: written into another session than its fence's"
            );
            assert!(
                fence >= last_fence,
                "{tag}: fence {fence} written after fence {last_fence}"
            );
            last_fence = fence;
            // The entry came after its fence was issued…
            assert!(
                entry.seq > grant.entries_at_grant,
                "{tag}: seq {} precedes its grant",
                entry.seq
            );
            // …and before the next fence on this session was issued.
            if let Some((next_fence, next)) = journal
                .grants
                .range(fence + 1..)
                .find(|(_, g)| g.session_id == *session_id)
            {
                assert!(
                    entry.seq <= next.entries_at_grant,
                    "{tag}: seq {} written after fence {next_fence} was issued at {}",
                    entry.seq,
                    next.entries_at_grant
                );
            }
        }
    }

    let mut acked_entries = 0;
    for ack in &journal.acks {
        let entries = &written[&ack.session_id];
        for (offset, tag) in ack.tags.iter().enumerate() {
            let seq = ack.first_seq + offset as u64;
            let entry = entries
                .get(seq as usize - 1)
                .unwrap_or_else(|| panic!("acknowledged {tag} at seq {seq} is missing"));
            assert_eq!(
                &suite::text_of(entry),
                tag,
                "acknowledged append at seq {seq} differs"
            );
            acked_entries += 1;
        }
    }
    assert_eq!(
        total_entries, acked_entries,
        "entries exist that no append acknowledged"
    );
    eprintln!(
        "race: {} grants, {} acked appends ({} entries), {} resets",
        journal.grants.len(),
        journal.acks.len(),
        acked_entries,
        journal.resets.len()
    );
    server.stop().await;
    harness.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_on_embedded() {
    race(harness::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_on_postgres() {
    race(harness::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_on_memory() {
    race(harness::memory().await).await;
}

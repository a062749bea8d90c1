//! Crash safety of the embedded backend: the real binary is SIGKILLed while
//! clients append and others take writer slots over in a loop (issuing
//! fences right up to the kill); after a restart on the same file every
//! acknowledged append is there, in order, and each session's fence
//! continues above the last one it issued.

mod suite;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_system_tests::process::{Process, service_command};
use clawgate_system_tests::wait::{poll, wait_until};
use session_store::SessionStore;
use session_store::grpc::client::RemoteStore;
use session_store::model::*;
use suite::key;

/// How long the process may take to answer (a bound on a broken one).
const DEADLINE: Duration = Duration::from_secs(30);
const WRITERS: usize = 8;
/// Sessions whose writer slot is taken over again and again.
const FENCERS: usize = 4;

/// The real binary on `store_file`, every listener on port 0.
async fn start(store_file: &std::path::Path) -> Process {
    let mut command = service_command(env!("CARGO_BIN_EXE_session-store"));
    command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(store_file);
    Process::start(command, "session-store", "session store serving gRPC").await
}

/// Connects once the process answers, or fails after a deadline.
async fn connect(process: &Process) -> RemoteStore {
    let answered = poll("session-store to answer", DEADLINE, async || {
        let remote = RemoteStore::connect(&process.url()).await.ok()?;
        let probe = remote.get_session(&key("probe")).await;
        probe.is_ok().then_some(remote)
    })
    .await;
    answered.unwrap_or_else(|timed_out| panic!("{timed_out}:\n{}", process.output_text()))
}

#[derive(Default)]
struct Acked {
    /// (session key, seq, tag) of every acknowledged entry.
    entries: Vec<(String, u64, String)>,
    /// The highest fence acknowledged per session.
    fences: std::collections::HashMap<String, u64>,
    /// Fences acknowledged in all.
    fences_issued: usize,
}

impl Acked {
    fn fence(&mut self, key: &session_store::SessionKey, fence: u64) {
        let highest = self.fences.entry(key.as_str().to_owned()).or_default();
        assert!(fence > *highest, "{key}: fence {fence} after {highest}");
        *highest = fence;
        self.fences_issued += 1;
    }
}

/// Takes its session's writer slot over in a loop until the server is gone.
async fn fencer(index: usize, store: RemoteStore, acked: Arc<Mutex<Acked>>) {
    let k = key(&format!("fence-{index}"));
    for n in 0.. {
        let run_id = format!("fencer-{index}-{n}");
        match store
            .acquire_writer(suite::acquire_req(&k, &run_id, None, AcquireMode::Takeover))
            .await
        {
            Ok(held) => acked.lock().unwrap().fence(&k, held.fence_token),
            Err(_) => return,
        }
    }
}

async fn writer(index: usize, store: RemoteStore, acked: Arc<Mutex<Acked>>) {
    let k = key(&format!("crash-{index}"));
    let Ok(held) = store
        .acquire_writer(suite::acquire_req(
            &k,
            &format!("run-{index}"),
            None,
            AcquireMode::Takeover,
        ))
        .await
    else {
        return;
    };
    acked.lock().unwrap().fence(&k, held.fence_token);
    for n in 0.. {
        let tag = format!("w{index}-{n}");
        match store
            .append(suite::append_req(
                &k,
                &held,
                &format!("run-{index}"),
                &[&tag],
            ))
            .await
        {
            Ok(done) => {
                acked
                    .lock()
                    .unwrap()
                    .entries
                    .push((k.as_str().to_owned(), done.first_seq, tag))
            }
            // The server is gone: stop writing.
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_appends_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let store_file = dir.path().join("store.redb");
    let mut process = start(&store_file).await;
    let store = connect(&process).await;

    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut writers: Vec<_> = (0..WRITERS)
        .map(|i| tokio::spawn(writer(i, store.clone(), acked.clone())))
        .collect();
    writers.extend((0..FENCERS).map(|i| tokio::spawn(fencer(i, store.clone(), acked.clone()))));
    // Kill while appends and takeovers are in flight, once a good number
    // of each were acknowledged.
    wait_until(
        "appends and takeovers to be acknowledged",
        2 * DEADLINE,
        || {
            let acked = acked.lock().unwrap();
            acked.entries.len() >= 400 && acked.fences_issued >= WRITERS + 200
        },
    )
    .await;
    process.kill().await; // SIGKILL
    for w in writers {
        w.await.unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());

    let mut process = start(&store_file).await;
    let store = connect(&process).await;
    for index in 0..WRITERS {
        let k = key(&format!("crash-{index}"));
        let mine: Vec<&(String, u64, String)> = acked
            .entries
            .iter()
            .filter(|(key, ..)| key == k.as_str())
            .collect();
        let entries = suite::transcript(&store, &k, None).await;
        assert!(entries.len() >= mine.len(), "{k}: entries lost");
        for (_, seq, tag) in mine {
            let entry = &entries[*seq as usize - 1];
            assert_eq!(entry.seq, *seq);
            assert_eq!(
                &suite::text_of(entry),
                tag,
                "{k}: seq {seq} holds something else"
            );
        }
        // In order with no gaps, including any unacknowledged tail that made it.
        for (i, entry) in entries.iter().enumerate() {
            assert_eq!(entry.seq, i as u64 + 1);
        }
    }
    // Every session that was given fences, the fencers' (whose takeovers
    // ran up to the kill) and the writers', continues above its highest.
    assert_eq!(acked.fences.len(), WRITERS + FENCERS);
    for (session, highest) in &acked.fences {
        let after = store
            .acquire_writer(suite::acquire_req(
                &key(session),
                "after-restart",
                None,
                AcquireMode::Takeover,
            ))
            .await
            .unwrap();
        assert!(
            after.fence_token > *highest,
            "{session}: fence {} reused after restart (highest acknowledged {highest})",
            after.fence_token,
        );
    }
    eprintln!(
        "crash: {} acknowledged appends and {} acknowledged fences survived SIGKILL",
        acked.entries.len(),
        acked.fences_issued
    );
    process.kill().await;
}

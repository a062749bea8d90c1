//! Crash safety of the embedded backend: the real binary is SIGKILLed while
//! clients append; after a restart on the same file every acknowledged append
//! is there, in order, and fence tokens continue above the last one issued.

mod suite;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_system_tests::process::{Process, service_command};
use session_store::SessionStore;
use session_store::grpc::client::RemoteStore;
use session_store::model::*;
use suite::key;

const WRITERS: usize = 8;

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
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(remote) = RemoteStore::connect(&process.url()).await
            && remote.get_session(&key("probe")).await.is_ok()
        {
            return remote;
        }
        assert!(
            Instant::now() < deadline,
            "session-store did not answer:\n{}",
            process.output().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Default)]
struct Acked {
    /// (session key, seq, tag) of every acknowledged entry.
    entries: Vec<(String, u64, String)>,
    highest_fence: u64,
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
    {
        let mut acked = acked.lock().unwrap();
        acked.highest_fence = acked.highest_fence.max(held.fence_token);
    }
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
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| tokio::spawn(writer(i, store.clone(), acked.clone())))
        .collect();
    // Kill while appends are in flight, once a good number were acknowledged.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().entries.len() < 400 {
        assert!(
            Instant::now() < deadline,
            "appends are not being acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    let after = store
        .acquire_writer(suite::acquire_req(
            &key("crash-0"),
            "after-restart",
            None,
            AcquireMode::Takeover,
        ))
        .await
        .unwrap();
    assert!(
        after.fence_token > acked.highest_fence,
        "fence {} reused after restart (highest issued {})",
        after.fence_token,
        acked.highest_fence
    );
    eprintln!(
        "crash: {} acknowledged appends survived SIGKILL",
        acked.entries.len()
    );
    process.kill().await;
}

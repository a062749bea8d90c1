//! Crash safety of the embedded backend: the real binary is SIGKILLed while
//! clients append; after a restart on the same file every acknowledged append
//! is there, in order, and fence tokens continue above the last one issued.

mod suite;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use session_store::SessionStore;
use session_store::grpc::client::RemoteStore;
use session_store::model::*;
use suite::key;
use tokio::process::{Child, Command};

const WRITERS: usize = 8;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(store_file: &std::path::Path, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_session-store"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--store")
        .arg(store_file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the session-store binary")
}

/// Connects once the child answers, or fails after a deadline.
async fn connect(port: u16) -> RemoteStore {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(remote) = RemoteStore::connect(&format!("http://127.0.0.1:{port}")).await
            && remote.get_session(&key("probe")).await.is_ok()
        {
            return remote;
        }
        assert!(Instant::now() < deadline, "session-store did not come up");
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
    let port = free_port();
    let mut child = start(&store_file, port);
    let store = connect(port).await;

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
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    for w in writers {
        w.await.unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());

    let mut child = start(&store_file, port);
    let store = connect(port).await;
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
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

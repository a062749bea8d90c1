//! Floor (c)'s durable commit: run records in a redb file, written by one
//! thread that commits in groups as the embedded store's writer does
//! (`session-store/src/backend/embedded/writer.rs`): it takes every write
//! waiting, up to [`MAX_GROUP`] (the store's default `max_batch`), applies
//! them in one write transaction, commits once with redb's default
//! durability (fsync) and only then answers each caller, so every answered
//! write is durable and under concurrency one fsync pays for many.
//!
//! Only the record is written, insert-if-absent by runId, as `CreateRun`
//! does; the store's other reads in that transaction (the lease row of the
//! owner check) are not. No bound holds callers back: the floor's load has
//! one write per connection in flight at most.

use std::path::Path;
use std::sync::mpsc;

use anyhow::Context;
use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

/// runId → the run record (protobuf).
const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");

/// The most writes one commit carries.
pub const MAX_GROUP: usize = 256;

/// One record to create, and who waits for its commit: `true` when it was
/// created, `false` when the runId had one already.
struct Write {
    run_id: String,
    record: Vec<u8>,
    done: oneshot::Sender<Result<bool, String>>,
}

/// The writer thread's queue. The thread stops once every handle is gone.
pub struct Committer {
    queue: mpsc::Sender<Write>,
}

impl Committer {
    /// Creates the file at `path` and starts the writer.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let db = Database::create(path).context("creating the floor's redb file")?;
        let txn = db.begin_write()?;
        txn.open_table(RUNS)?;
        txn.commit()?;
        let (queue, writes) = mpsc::channel();
        std::thread::Builder::new()
            .name("floor-writer".into())
            .spawn(move || commit_groups(&db, &writes))
            .context("starting the floor's writer")?;
        Ok(Self { queue })
    }

    /// Records `record` under `run_id` unless the runId has one; answers
    /// once the group it went in is durable.
    pub async fn create(&self, run_id: String, record: Vec<u8>) -> anyhow::Result<bool> {
        let (done, answer) = oneshot::channel();
        let stopped = || anyhow::anyhow!("the floor's writer has stopped");
        self.queue
            .send(Write {
                run_id,
                record,
                done,
            })
            .map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(anyhow::Error::msg)
    }
}

/// Commits groups until every sender is gone.
fn commit_groups(db: &Database, writes: &mpsc::Receiver<Write>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while let Ok(first) = writes.recv() {
        group.push(first);
        group.extend(writes.try_iter().take(MAX_GROUP - 1));
        match commit(db, &group) {
            Ok(created) => {
                for (write, created) in group.drain(..).zip(created) {
                    let _ = write.done.send(Ok(created));
                }
            }
            Err(e) => {
                let message = format!("the floor's commit failed: {e}");
                for write in group.drain(..) {
                    let _ = write.done.send(Err(message.clone()));
                }
            }
        }
    }
}

/// One transaction for `group`, committed; whether each write created its
/// record.
fn commit(db: &Database, group: &[Write]) -> Result<Vec<bool>, redb::Error> {
    let txn = db.begin_write()?;
    let mut created = Vec::with_capacity(group.len());
    {
        let mut runs = txn.open_table(RUNS)?;
        for write in group {
            let new = runs.get(write.run_id.as_str())?.is_none();
            if new {
                runs.insert(write.run_id.as_str(), write.record.as_slice())?;
            }
            created.push(new);
        }
    }
    txn.commit()?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record is written once, whether its duplicate comes in the same
    /// group or a later one.
    #[tokio::test]
    async fn records_are_created_once() {
        let dir = tempfile::tempdir().unwrap();
        let committer = Committer::open(&dir.path().join("floor.redb")).unwrap();
        let writes = (0..8).map(|i| committer.create(format!("run-{}", i % 4), vec![i]));
        let created: Vec<bool> = futures::future::join_all(writes)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(created.iter().filter(|c| **c).count(), 4, "{created:?}");
        assert!(!committer.create("run-0".into(), vec![]).await.unwrap());
        assert!(committer.create("run-4".into(), vec![]).await.unwrap());
    }
}

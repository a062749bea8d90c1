//! The PostgreSQL backend. Several store replicas may share one database.
//!
//! Every write is one READ COMMITTED transaction that locks the session row
//! (`SELECT ... FOR UPDATE`), rebuilds a `rules::SessionSlot` from it, applies
//! the `rules` function and writes the row back: the decisions are those of
//! `rules`, as in every backend, and the row lock makes them atomic across
//! replicas. Session rows are never deleted (they carry the never-reused
//! fence counter), so `INSERT ... ON CONFLICT DO NOTHING` then `FOR UPDATE`
//! always finds a row to lock.
//!
//! Lock order: only UpdateRun locks two rows, its run row first and then the
//! session row. Nothing locks a session row and then a run row, so writers
//! cannot deadlock each other.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Client, GenericClient, Manager, Pool, Transaction};
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{IsolationLevel, NoTls, Row};
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules::{self, SessionSlot, SessionState, Writer};
use crate::store::{SessionStore, now_ms};

/// Applied in order, each at most once per schema (see `schema_migrations`).
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_sessions.sql")),
    (2, include_str!("../../migrations/0002_transcript.sql")),
    (3, include_str!("../../migrations/0003_runs.sql")),
];

/// Advisory lock serializing schema creation and migrations across replicas.
const MIGRATION_LOCK_KEY: i64 = 0x5345_5353_5354_4f52;

/// Rows per ListSessions batch when a search term is filtered in Rust.
const LIST_BATCH: usize = 256;

// Column lists, so that row decoding can go by index.
macro_rules! session_columns {
    () => {
        "session_key, last_fence, session_id::text, writer_run_id, writer_fence, \
         created_at_ms, updated_at_ms, label, last_run_id, last_run_status, entry_count"
    };
}
macro_rules! run_columns {
    () => {
        "run_id, session_key, kind, fingerprint, status, version, created_at_ms, \
         updated_at_ms, started_at_ms, ended_at_ms, owner, request_json, outcome_json, \
         session_id::text, fence_token"
    };
}
/// The non-terminal statuses (`!RunStatus::is_terminal`), spelled like the
/// predicate of the `runs_active_idx` partial index so the planner can use it.
macro_rules! active_statuses {
    () => {
        "('accepted', 'queued', 'running')"
    };
}

const SELECT_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_key = $1"
);
const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_key = $1 FOR UPDATE"
);
const INSERT_SESSION: &str = "INSERT INTO sessions (session_key, last_fence) VALUES ($1, 0) \
     ON CONFLICT (session_key) DO NOTHING";
const UPDATE_SESSION: &str = "UPDATE sessions SET last_fence = $2, session_id = $3::text::uuid, \
     writer_run_id = $4, writer_fence = $5, created_at_ms = $6, updated_at_ms = $7, label = $8, \
     last_run_id = $9, last_run_status = $10, entry_count = $11 WHERE session_key = $1";
/// Newest first, ties by key; keyset paging after ($2, $3).
const LIST_SESSIONS: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id IS NOT NULL \
     AND ($1::bigint IS NULL OR updated_at_ms >= $1) \
     AND ($2::bigint IS NULL OR updated_at_ms < $2 OR (updated_at_ms = $2 AND session_key > $3)) \
     ORDER BY updated_at_ms DESC, session_key LIMIT $4"
);

const INSERT_ENTRIES: &str = "INSERT INTO transcript_entries (session_id, seq, role, \
     content_json, timestamp_ms, run_id, stop_reason, usage_json, aborted) \
     SELECT $1::text::uuid, e.* FROM UNNEST($2::bigint[], $3::text[], $4::text[], \
     $5::bigint[], $6::text[], $7::text[], $8::text[], $9::boolean[]) AS e";
const SELECT_ENTRIES: &str = "SELECT seq, role, content_json, timestamp_ms, run_id, \
     stop_reason, usage_json, aborted FROM transcript_entries \
     WHERE session_id = $1::text::uuid AND seq BETWEEN $2 AND $3 ORDER BY seq";
const DELETE_ENTRIES: &str = "DELETE FROM transcript_entries WHERE session_id = $1::text::uuid";

const SELECT_RUN: &str = concat!("SELECT ", run_columns!(), " FROM runs WHERE run_id = $1");
const LOCK_RUN: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs WHERE run_id = $1 FOR UPDATE"
);
const INSERT_RUN: &str = "INSERT INTO runs (run_id, session_key, kind, fingerprint, status, \
     version, created_at_ms, updated_at_ms, started_at_ms, ended_at_ms, owner, request_json, \
     outcome_json, session_id, fence_token) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
     $11, $12, $13, $14::text::uuid, $15) ON CONFLICT (run_id) DO NOTHING";
const UPDATE_RUN: &str = "UPDATE runs SET status = $2, version = $3, updated_at_ms = $4, \
     started_at_ms = $5, ended_at_ms = $6, owner = $7, outcome_json = $8, \
     session_id = $9::text::uuid, fence_token = $10 WHERE run_id = $1";
const LIST_ACTIVE_RUNS: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs WHERE status IN ",
    active_statuses!(),
    " AND ($1::text IS NULL OR owner = $1) ORDER BY created_at_ms, run_id"
);
/// `rules::run_expired` as SQL. The rows are locked in run_id order so that
/// concurrent purges from several replicas cannot deadlock.
const PURGE_RUNS: &str = concat!(
    "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs WHERE status NOT IN ",
    active_statuses!(),
    " AND ended_at_ms < $1 ORDER BY run_id FOR UPDATE)"
);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// Schema holding the tables, created when missing; `[a-z0-9_]`, at most
    /// 63 characters. `None`: the server's default `search_path`.
    pub schema: Option<String>,
    /// Maximum pooled connections (at least 1 is used).
    pub pool_size: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: None,
            pool_size: 16,
        }
    }
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

impl PostgresStore {
    /// Connects, creates the schema if asked and missing, and applies the
    /// pending migrations. Safe when several replicas start at once.
    pub async fn connect(url: &str, options: PgOptions) -> StoreResult<Self> {
        let schema = options.schema.as_deref().map(checked_schema).transpose()?;
        let mut config = parse_url(url)?;
        if let Some(schema) = schema {
            // Every pooled connection starts with the schema as its search_path.
            let opts = format!(
                "{} -c search_path={schema}",
                config.get_options().unwrap_or_default()
            );
            config.options(opts.trim_start());
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let pool = Pool::builder(Manager::new(config, NoTls))
            .max_size(options.pool_size.max(1))
            .build()
            .map_err(StoreError::internal)?;
        let store = Self { pool };
        store.migrate(schema).await?;
        Ok(store)
    }

    async fn migrate(&self, schema: Option<&str>) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        // Held until commit: replicas starting together migrate one by one.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
            .await
            .map_err(db_error)?;
        if let Some(schema) = schema {
            // Checked first so that a role without CREATE on the database can
            // use a schema someone else created.
            let found = tx
                .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
                .await
                .map_err(db_error)?;
            if found.is_none() {
                batch(&tx, &format!("CREATE SCHEMA \"{schema}\"")).await?;
            }
            batch(&tx, &format!("SET LOCAL search_path TO \"{schema}\"")).await?;
        }
        batch(
            &tx,
            "CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY, \
             applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
        let applied: HashSet<i64> = tx
            .query("SELECT version FROM schema_migrations", &[])
            .await
            .map_err(db_error)?
            .iter()
            .map(|row| col(row, 0))
            .collect::<StoreResult<_>>()?;
        for (version, sql) in MIGRATIONS {
            if !applied.contains(version) {
                batch(&tx, sql).await?;
                tx.execute(
                    "INSERT INTO schema_migrations (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(db_error)?;
                tracing::info!(version, "applied session-store migration");
            }
        }
        tx.commit().await.map_err(db_error)
    }

    async fn client(&self) -> StoreResult<Client> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("PostgreSQL: {e}")))
    }
}

/// Drops `schema` and everything in it (test cleanup).
pub async fn drop_schema(url: &str, schema: &str) -> StoreResult<()> {
    let schema = checked_schema(schema)?;
    let (client, connection) = parse_url(url)?.connect(NoTls).await.map_err(db_error)?;
    let driver = tokio::spawn(connection);
    let dropped = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(db_error);
    drop(client);
    let _ = driver.await;
    dropped
}

fn parse_url(url: &str) -> StoreResult<tokio_postgres::Config> {
    url.parse()
        .map_err(|e| StoreError::invalid(format!("invalid PostgreSQL URL: {}", describe(&e))))
}

/// Schema names are spliced into SQL (quoted), so only `[a-z0-9_]` passes.
fn checked_schema(schema: &str) -> StoreResult<&str> {
    let ok = (1..=63).contains(&schema.len())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(schema)
    } else {
        Err(StoreError::invalid(format!(
            "schema {schema:?} must be 1..=63 characters of [a-z0-9_]"
        )))
    }
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn acquire_writer(&self, req: AcquireWriter) -> StoreResult<Acquired> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        let mut slot = lock_slot_creating(&tx, &req.key).await?;
        // On error the transaction rolls back, row creation included.
        let acquired = rules::acquire(&mut slot, &req, now_ms(), Uuid::new_v4)?;
        save_slot(&tx, &req.key, &slot).await?;
        commit(tx).await?;
        Ok(acquired)
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
    ) -> StoreResult<Released> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        let Some(mut slot) = lock_slot(&tx, key).await? else {
            return Ok(Released {
                released: false,
                session: None,
            });
        };
        let released = rules::release(&mut slot, run_id, fence_token, now_ms());
        if released {
            save_slot(&tx, key, &slot).await?;
        }
        commit(tx).await?;
        Ok(Released {
            released,
            session: slot.view(key),
        })
    }

    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        let now = now_ms();
        // No row: no session, which reserve_append refuses.
        let mut slot = lock_slot(&tx, &req.key).await?.unwrap_or_default();
        let first_seq = rules::reserve_append(&mut slot, &req, now)?;
        let session = slot
            .view(&req.key)
            .ok_or_else(|| StoreError::internal("append left no session"))?;
        let stamped = rules::stamp_entries(&req, first_seq, now);
        let last_seq = first_seq + stamped.len() as u64 - 1;
        save_slot(&tx, &req.key, &slot).await?;
        insert_entries(&tx, req.session_id, &stamped).await?;
        // Durable once the commit returns.
        commit(tx).await?;
        Ok(Appended {
            first_seq,
            last_seq,
            session,
        })
    }

    async fn history(&self, query: HistoryQuery) -> StoreResult<HistoryPage> {
        let mut client = self.client().await?;
        // One snapshot for the row and the entries, so that a concurrent
        // delete or append cannot tear the page.
        let tx = begin_snapshot(&mut client).await?;
        let Some(session) = read_slot(&tx, &query.key)
            .await?
            .and_then(|slot| slot.view(&query.key))
        else {
            return Ok(HistoryPage::default());
        };
        let total = session.entry_count;
        let (entries, more) = match rules::history_window(query.cursor, query.limit, total) {
            None => (Vec::new(), false),
            Some((lower, upper, more)) => {
                let id = session.session_id.to_string();
                let rows = fetch(&tx, SELECT_ENTRIES, &[&id, &to_db(lower), &to_db(upper)]).await?;
                let entries = rows
                    .iter()
                    .map(entry_from_row)
                    .collect::<StoreResult<_>>()?;
                (entries, more)
            }
        };
        commit(tx).await?;
        Ok(rules::finish_page(
            session.session_id,
            query.cursor,
            entries,
            more,
            query.max_chars,
            total,
        ))
    }

    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        let client = self.client().await?;
        Ok(read_slot(&client, key).await?.and_then(|s| s.view(key)))
    }

    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        let limit = query.limit as usize;
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let mut client = self.client().await?;
        let tx = begin_snapshot(&mut client).await?;
        // `updated_since_ms` is filtered in SQL exactly. A search term is
        // filtered in Rust by rules::list_matches (ILIKE's case folding
        // depends on the database locale), walking batches newest first.
        let batch = if query.search.is_none() {
            limit.min(LIST_BATCH * 4)
        } else {
            LIST_BATCH
        };
        let mut after: Option<(i64, String)> = None;
        loop {
            let rows = fetch(
                &tx,
                LIST_SESSIONS,
                &[
                    &query.updated_since_ms,
                    &after.as_ref().map(|a| a.0),
                    &after.as_ref().map(|a| a.1.as_str()),
                    &(batch as i64),
                ],
            )
            .await?;
            for row in &rows {
                let key = key_from_db(&col::<String>(row, 0)?)?;
                let session = slot_from_row(row)?.view(&key);
                if let Some(session) = session.filter(|s| rules::list_matches(s, &query)) {
                    found.push(session);
                    if found.len() == limit {
                        return Ok(found);
                    }
                }
            }
            match rows.last() {
                Some(last) if rows.len() == batch => after = Some((col(last, 6)?, col(last, 0)?)),
                _ => break,
            }
        }
        commit(tx).await?;
        Ok(found)
    }

    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        let mut slot = lock_slot_creating(&tx, key).await?;
        let outcome = rules::reset(&mut slot, key, now_ms(), Uuid::new_v4());
        save_slot(&tx, key, &slot).await?;
        commit(tx).await?;
        Ok(outcome)
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        let Some(mut slot) = lock_slot(&tx, key).await? else {
            return Ok(rules::delete(&mut SessionSlot::default()));
        };
        // The row stays, with its fence counter; only the session goes.
        let outcome = rules::delete(&mut slot);
        if outcome.deleted {
            save_slot(&tx, key, &slot).await?;
        }
        if let (true, Some(old)) = (delete_transcript, outcome.previous_session_id) {
            run(&tx, DELETE_ENTRIES, &[&old.to_string()]).await?;
        }
        commit(tx).await?;
        Ok(outcome)
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let client = self.client().await?;
        let r = rules::new_run_record(&new, now_ms());
        // A conflicting record may be purged between the INSERT and the
        // SELECT; then the INSERT is tried again.
        for _ in 0..3 {
            let inserted = run(
                &client,
                INSERT_RUN,
                &[
                    &r.run_id,
                    &r.session_key,
                    &r.kind,
                    &r.fingerprint,
                    &r.status.as_str(),
                    &to_db(r.version),
                    &r.created_at_ms,
                    &r.updated_at_ms,
                    &r.started_at_ms,
                    &r.ended_at_ms,
                    &r.owner,
                    &r.request_json,
                    &r.outcome_json,
                    &r.session_id.map(|id| id.to_string()),
                    &r.fence_token.map(to_db),
                ],
            )
            .await?;
            if inserted == 1 {
                return Ok(CreateRunOutcome {
                    created: true,
                    record: r,
                    fingerprint_mismatch: false,
                });
            }
            if let Some(row) = fetch_opt(&client, SELECT_RUN, &[&new.run_id]).await? {
                return Ok(rules::existing_run(run_from_row(&row)?, &new));
            }
        }
        Err(StoreError::internal(format!(
            "run {:?} neither inserted nor found",
            new.run_id
        )))
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let mut client = self.client().await?;
        let tx = begin(&mut client).await?;
        // Run row first, session row second (see the module docs).
        let Some(row) = fetch_opt(&tx, LOCK_RUN, &[&update.run_id]).await? else {
            return Err(StoreError::RunNotFound(update.run_id));
        };
        let mut r = run_from_row(&row)?;
        rules::update_run(&mut r, &update, now_ms())?;
        run(
            &tx,
            UPDATE_RUN,
            &[
                &r.run_id,
                &r.status.as_str(),
                &to_db(r.version),
                &r.updated_at_ms,
                &r.started_at_ms,
                &r.ended_at_ms,
                &r.owner,
                &r.outcome_json,
                &r.session_id.map(|id| id.to_string()),
                &r.fence_token.map(to_db),
            ],
        )
        .await?;
        // Like the memory backend: a record whose key does not parse touches
        // no session.
        if let Ok(key) = SessionKey::parse(&r.session_key)
            && let Some(before) = lock_slot(&tx, &key).await?
        {
            let mut slot = before.clone();
            rules::note_run_status(&mut slot, &r);
            if slot != before {
                save_slot(&tx, &key, &slot).await?;
            }
        }
        commit(tx).await?;
        Ok(r)
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let client = self.client().await?;
        let row = fetch_opt(&client, SELECT_RUN, &[&run_id]).await?;
        row.as_ref().map(run_from_row).transpose()
    }

    async fn list_active_runs(&self, owner: Option<&str>) -> StoreResult<Vec<RunRecord>> {
        let client = self.client().await?;
        let rows = fetch(&client, LIST_ACTIVE_RUNS, &[&owner]).await?;
        rows.iter().map(run_from_row).collect()
    }

    async fn purge_expired_runs(&self, ended_before_ms: i64) -> StoreResult<u64> {
        let client = self.client().await?;
        run(&client, PURGE_RUNS, &[&ended_before_ms]).await
    }
}

/// A write transaction. READ COMMITTED suffices: every decision is taken on
/// rows locked FOR UPDATE, which a statement reads in their latest committed
/// version once it holds the lock.
async fn begin(client: &mut Client) -> StoreResult<Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(db_error)
}

/// A read-only snapshot, for reads spanning several statements.
async fn begin_snapshot(client: &mut Client) -> StoreResult<Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db_error)
}

async fn commit(tx: Transaction<'_>) -> StoreResult<()> {
    tx.commit().await.map_err(db_error)
}

async fn batch(tx: &Transaction<'_>, sql: &str) -> StoreResult<()> {
    tx.batch_execute(sql).await.map_err(db_error)
}

type Params<'a> = [&'a (dyn ToSql + Sync)];

async fn fetch(c: &impl GenericClient, sql: &str, params: &Params<'_>) -> StoreResult<Vec<Row>> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.query(&statement, params).await.map_err(db_error)
}

async fn fetch_opt(
    c: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<Option<Row>> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.query_opt(&statement, params).await.map_err(db_error)
}

async fn run(c: &impl GenericClient, sql: &str, params: &Params<'_>) -> StoreResult<u64> {
    let statement = c.prepare_cached(sql).await.map_err(db_error)?;
    c.execute(&statement, params).await.map_err(db_error)
}

/// The session row of `key` without a lock; `None` if the key never had one.
async fn read_slot(c: &impl GenericClient, key: &SessionKey) -> StoreResult<Option<SessionSlot>> {
    let row = fetch_opt(c, SELECT_SESSION, &[&key.as_str()]).await?;
    row.as_ref().map(slot_from_row).transpose()
}

/// Locks the session row of `key`; `None` if the key never had one.
async fn lock_slot(tx: &Transaction<'_>, key: &SessionKey) -> StoreResult<Option<SessionSlot>> {
    let row = fetch_opt(tx, LOCK_SESSION, &[&key.as_str()]).await?;
    row.as_ref().map(slot_from_row).transpose()
}

/// Locks the session row of `key`, creating it (no session, fence 0) first if
/// missing. A concurrent creator makes the INSERT wait and then do nothing.
async fn lock_slot_creating(tx: &Transaction<'_>, key: &SessionKey) -> StoreResult<SessionSlot> {
    run(tx, INSERT_SESSION, &[&key.as_str()]).await?;
    lock_slot(tx, key)
        .await?
        .ok_or_else(|| StoreError::internal(format!("session row of {key} vanished")))
}

/// Writes the whole slot back to its (locked) row.
async fn save_slot(tx: &Transaction<'_>, key: &SessionKey, slot: &SessionSlot) -> StoreResult<()> {
    let s = slot.current.as_ref();
    let writer = s.and_then(|s| s.writer.as_ref());
    let updated = run(
        tx,
        UPDATE_SESSION,
        &[
            &key.as_str(),
            &to_db(slot.last_fence),
            &s.map(|s| s.session_id.to_string()),
            &writer.map(|w| w.run_id.as_str()),
            &writer.map(|w| to_db(w.fence)),
            &s.map(|s| s.created_at_ms),
            &s.map(|s| s.updated_at_ms),
            &s.and_then(|s| s.label.as_deref()),
            &s.and_then(|s| s.last_run_id.as_deref()),
            &s.and_then(|s| s.last_run_status.map(RunStatus::as_str)),
            &to_db(s.map_or(0, |s| s.entry_count)),
        ],
    )
    .await?;
    if updated == 1 {
        Ok(())
    } else {
        Err(StoreError::internal(format!(
            "session row of {key} vanished"
        )))
    }
}

/// Inserts all entries in one statement (one array per column).
async fn insert_entries(
    tx: &Transaction<'_>,
    session_id: SessionId,
    entries: &[TranscriptEntry],
) -> StoreResult<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = entries.iter().map(|e| to_db(e.seq)).collect();
    let roles: Vec<&str> = entries.iter().map(|e| e.role.as_str()).collect();
    let contents: Vec<&str> = entries.iter().map(|e| e.content_json.as_str()).collect();
    let timestamps: Vec<i64> = entries.iter().map(|e| e.timestamp_ms).collect();
    let run_ids: Vec<&str> = entries.iter().map(|e| e.run_id.as_str()).collect();
    let meta = entries.iter().map(|e| &e.metadata);
    let stop_reasons: Vec<Option<&str>> = meta.clone().map(|m| m.stop_reason.as_deref()).collect();
    let usages: Vec<Option<&str>> = meta.clone().map(|m| m.usage_json.as_deref()).collect();
    let aborted: Vec<bool> = meta.map(|m| m.aborted).collect();
    let id = session_id.to_string();
    let params: [&(dyn ToSql + Sync); 9] = [
        &id,
        &seqs,
        &roles,
        &contents,
        &timestamps,
        &run_ids,
        &stop_reasons,
        &usages,
        &aborted,
    ];
    run(tx, INSERT_ENTRIES, &params).await.map(drop)
}

fn col<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> StoreResult<T> {
    row.try_get(idx)
        .map_err(|e| StoreError::internal(describe(&e)))
}

fn parse_uuid(text: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(text).map_err(StoreError::internal)
}

fn parse_status(text: &str) -> StoreResult<RunStatus> {
    RunStatus::parse(text)
        .ok_or_else(|| StoreError::internal(format!("unknown run status {text:?} in the database")))
}

/// u64 counters (fences, seqs, versions, callers' run fence tokens) are kept
/// bit for bit in bigint columns: lossless both ways. The ones the store
/// issues count up from 0 and never reach the sign bit.
fn to_db(value: u64) -> i64 {
    value as i64
}

fn from_db(value: i64) -> u64 {
    value as u64
}

/// Decodes a row of `session_columns!()`.
fn slot_from_row(row: &Row) -> StoreResult<SessionSlot> {
    let last_fence = from_db(col(row, 1)?);
    let Some(session_id) = col::<Option<String>>(row, 2)? else {
        return Ok(SessionSlot {
            last_fence,
            current: None,
        });
    };
    let writer = match (col(row, 3)?, col::<Option<i64>>(row, 4)?) {
        (Some(run_id), Some(fence)) => Some(Writer {
            run_id,
            fence: from_db(fence),
        }),
        _ => None,
    };
    let required = |idx| {
        col::<Option<i64>>(row, idx)?
            .ok_or_else(|| StoreError::internal("session row without timestamps"))
    };
    let last_run_status = col::<Option<String>>(row, 9)?;
    Ok(SessionSlot {
        last_fence,
        current: Some(SessionState {
            session_id: parse_uuid(&session_id)?,
            writer,
            created_at_ms: required(5)?,
            updated_at_ms: required(6)?,
            label: col(row, 7)?,
            last_run_id: col(row, 8)?,
            last_run_status: last_run_status.as_deref().map(parse_status).transpose()?,
            entry_count: from_db(col(row, 10)?),
        }),
    })
}

/// Decodes a row of `run_columns!()`.
fn run_from_row(row: &Row) -> StoreResult<RunRecord> {
    let session_id = col::<Option<String>>(row, 13)?;
    Ok(RunRecord {
        run_id: col(row, 0)?,
        session_key: col(row, 1)?,
        kind: col(row, 2)?,
        fingerprint: col(row, 3)?,
        status: parse_status(col(row, 4)?)?,
        version: from_db(col(row, 5)?),
        created_at_ms: col(row, 6)?,
        updated_at_ms: col(row, 7)?,
        started_at_ms: col(row, 8)?,
        ended_at_ms: col(row, 9)?,
        owner: col(row, 10)?,
        request_json: col(row, 11)?,
        outcome_json: col(row, 12)?,
        session_id: session_id.as_deref().map(parse_uuid).transpose()?,
        fence_token: col::<Option<i64>>(row, 14)?.map(from_db),
    })
}

fn entry_from_row(row: &Row) -> StoreResult<TranscriptEntry> {
    Ok(TranscriptEntry {
        seq: from_db(col(row, 0)?),
        role: col(row, 1)?,
        content_json: col(row, 2)?,
        timestamp_ms: col(row, 3)?,
        run_id: col(row, 4)?,
        metadata: EntryMetadata {
            stop_reason: col(row, 5)?,
            usage_json: col(row, 6)?,
            aborted: col(row, 7)?,
        },
    })
}

/// The SessionKey of a stored (canonical) key. Parsing a canonical key gives
/// it back, except that `agent:main:` + a raw key of up to 512 characters can
/// exceed the 512-character input limit; that raw key parses to it.
fn key_from_db(stored: &str) -> StoreResult<SessionKey> {
    let reparse = |raw: &str| SessionKey::parse(raw).ok().filter(|k| k.as_str() == stored);
    reparse(stored)
        .or_else(|| stored.strip_prefix("agent:main:").and_then(reparse))
        .ok_or_else(|| {
            StoreError::internal(format!("stored session key {stored:?} is not canonical"))
        })
}

/// Maps a driver error: trouble worth a retry (connection, server shutdown,
/// resources, timeouts, serialization) is Unavailable; text PostgreSQL cannot
/// store (a NUL character) is the caller's; anything else is Internal.
fn db_error(err: tokio_postgres::Error) -> StoreError {
    let message = describe(&err);
    let Some(code) = err.code().map(|c| c.code()) else {
        let io = std::error::Error::source(&err).is_some_and(|s| s.is::<std::io::Error>());
        return if err.is_closed() || io {
            StoreError::Unavailable(message)
        } else {
            StoreError::Internal(message)
        };
    };
    match code {
        "22021" | "22P05" => {
            StoreError::invalid(format!("a text value cannot be stored: {message}"))
        }
        "40001" | "40P01" | "55P03" => StoreError::Unavailable(message),
        _ if ["08", "53", "57"]
            .iter()
            .any(|class| code.starts_with(class)) =>
        {
            StoreError::Unavailable(message)
        }
        _ => StoreError::Internal(message),
    }
}

/// tokio-postgres' Display omits the cause (the server's message).
fn describe(err: &tokio_postgres::Error) -> String {
    match std::error::Error::source(err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

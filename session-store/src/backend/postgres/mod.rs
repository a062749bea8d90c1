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
//! Partition ownership (`leases`): a coordinator's write first locks its
//! partition's lease row `FOR KEY SHARE` and checks its owner token there, in
//! the same transaction as the write.
//!
//! Lock order: a lease row first (coordinator writes), then for UpdateRun its
//! run row and then the session row. Nothing locks a session row and then a
//! run row, nor a run or session row and then a lease row, so writers cannot
//! deadlock each other.
//!
//! Long file: the `SessionStore` impl is one block of the trait's two dozen
//! methods, and a trait impl cannot be split across files; each method is
//! one transaction over the helpers in `tx.rs` (transactions, rule application), `rows.rs`, `sql.rs`, `leases.rs` and `members.rs`.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Client, Manager, Pool, PoolError};
use tokio_postgres::NoTls;

use self::tls::Connector;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::key::SessionKey;
use crate::model::*;
use crate::rules;
use crate::rules::ownership;
use crate::store::SessionStore;
use clawgate_common::clock::now_ms;

mod leases;
mod members;
mod rows;
#[macro_use]
mod sql;
pub mod tls;
mod tx;
use rows::*;
use sql::*;
use tx::*;

/// Applied in order, each at most once per schema (see `schema_migrations`).
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../../migrations/0001_sessions.sql")),
    (2, include_str!("../../../migrations/0002_transcript.sql")),
    (3, include_str!("../../../migrations/0003_runs.sql")),
    (4, include_str!("../../../migrations/0004_ownership.sql")),
    (
        5,
        include_str!("../../../migrations/0005_session_settings.sql"),
    ),
    (6, include_str!("../../../migrations/0006_members.sql")),
];

/// Advisory lock serializing schema creation and migrations across replicas.
const MIGRATION_LOCK_KEY: i64 = 0x5345_5353_5354_4f52;

/// Rows per ListSessions batch when a search term is filtered in Rust.
const LIST_BATCH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// Schema holding the tables, created when missing; `[a-z0-9_]`, at most
    /// 63 characters. `None`: the server's default `search_path`.
    pub schema: Option<String>,
    /// Maximum pooled connections (at least 1 is used).
    pub pool_size: usize,
    /// Connections of a second pool that only admission (CreateRun) and
    /// leases use, so that they never wait for a connection behind the
    /// writes of executing runs; 0: they use the main pool.
    pub admission_pool_size: usize,
    /// The partition count; written at the first start, checked at every
    /// later one.
    pub partitions: u32,
    /// The largest settings object of a session (`--max-settings-bytes`).
    pub max_settings_bytes: usize,
    /// The most live entries of the member registry (`--max-members`).
    pub max_members: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: None,
            pool_size: 16,
            admission_pool_size: 4,
            partitions: clawgate_common::partition::DEFAULT_PARTITIONS,
            max_settings_bytes: rules::DEFAULT_MAX_SETTINGS_BYTES,
            max_members: ownership::DEFAULT_MAX_MEMBERS,
        }
    }
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// Admission and leases (see `PgOptions::admission_pool_size`).
    urgent: Pool,
    partitions: u32,
    max_settings_bytes: usize,
    max_members: usize,
}

impl PostgresStore {
    /// Connects, creates the schema if asked and missing, and applies the
    /// pending migrations. Safe when several replicas start at once.
    pub async fn connect(url: &str, options: PgOptions) -> StoreResult<Self> {
        let schema = options.schema.as_deref().map(checked_schema).transpose()?;
        let partitions = options.partitions;
        clawgate_common::partition::check_partitions(partitions).map_err(StoreError::invalid)?;
        let Connector {
            mut config,
            tls,
            mode,
        } = Connector::from_url(url)?;
        tracing::debug!(sslmode = ?mode, "connecting to PostgreSQL");
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
        let pool_of = |size: usize| {
            let manager = match &tls {
                Some(tls) => Manager::new(config.clone(), tls.clone()),
                None => Manager::new(config.clone(), NoTls),
            };
            Pool::builder(manager)
                .max_size(size)
                .build()
                .map_err(StoreError::internal)
        };
        let pool = pool_of(options.pool_size.max(1))?;
        let urgent = match options.admission_pool_size {
            0 => pool.clone(),
            size => pool_of(size)?,
        };
        let store = Self {
            pool,
            urgent,
            partitions,
            max_settings_bytes: options.max_settings_bytes,
            max_members: options.max_members,
        };
        store.migrate(schema).await?;
        Ok(store)
    }

    async fn migrate(&self, schema: Option<&str>) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        // Held until commit: replicas starting together migrate one by one.
        run(
            &tx,
            "SELECT pg_advisory_xact_lock($1)",
            &[&MIGRATION_LOCK_KEY],
        )
        .await?;
        if let Some(schema) = schema {
            // Looked up first so that a role without CREATE on the database
            // can use a schema someone else created.
            let exists = "SELECT 1 FROM pg_namespace WHERE nspname = $1";
            if fetch_opt(&tx, exists, &[&schema]).await?.is_none() {
                batch(&tx, &format!("CREATE SCHEMA \"{schema}\"")).await?;
            }
            batch(&tx, &format!("SET LOCAL search_path TO \"{schema}\"")).await?;
        }
        let create = "CREATE TABLE IF NOT EXISTS schema_migrations \
            (version bigint PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())";
        batch(&tx, create).await?;
        let rows = fetch(&tx, "SELECT version FROM schema_migrations", &[]).await?;
        let applied: HashSet<i64> = rows
            .iter()
            .map(|row| col(row, 0))
            .collect::<StoreResult<_>>()?;
        // Versions this build does not know (a newer replica's) are left alone.
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| !applied.contains(v)) {
            batch(&tx, sql).await?;
            run(
                &tx,
                "INSERT INTO schema_migrations (version) VALUES ($1)",
                &[version],
            )
            .await?;
            tracing::info!(version, "applied session-store migration");
        }
        leases::settle_partitions(&tx, self.partitions).await?;
        commit(tx).await
    }

    async fn client(&self) -> StoreResult<Client> {
        Self::client_of(&self.pool).await
    }

    /// A connection of the admission pool.
    async fn urgent_client(&self) -> StoreResult<Client> {
        Self::client_of(&self.urgent).await
    }

    async fn client_of(pool: &Pool) -> StoreResult<Client> {
        pool.get().await.map_err(|err| {
            StoreError::Unavailable(match err {
                PoolError::Backend(err) => format!("PostgreSQL: {}", describe(&err)),
                err => format!("PostgreSQL connection pool: {err}"),
            })
        })
    }
}

/// Drops `schema` and everything in it (test cleanup).
pub async fn drop_schema(url: &str, schema: &str) -> StoreResult<()> {
    let schema = checked_schema(schema)?;
    let Connector { config, tls, .. } = Connector::from_url(url)?;
    let (client, driver) = match tls {
        Some(tls) => {
            let (client, connection) = config.connect(tls).await.map_err(db_error)?;
            (client, tokio::spawn(connection))
        }
        None => {
            let (client, connection) = config.connect(NoTls).await.map_err(db_error)?;
            (client, tokio::spawn(connection))
        }
    };
    let dropped = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(db_error);
    drop(client);
    let _ = driver.await;
    dropped
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
        let tx = begin(&mut client, false).await?;
        leases::check_owner(&tx, &req.key, req.owner_token.as_ref(), self.partitions).await?;
        let acquired = apply(&tx, &req.key, true, |slot| {
            rules::acquire(slot, &req, now_ms(), Uuid::new_v4)
        })
        .await?;
        commit(tx).await?;
        Ok(acquired)
    }

    async fn release_writer(
        &self,
        key: &SessionKey,
        run_id: &str,
        fence_token: u64,
        owner_token: Option<&OwnerToken>,
    ) -> StoreResult<Released> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        leases::check_owner(&tx, key, owner_token, self.partitions).await?;
        let released = apply(&tx, key, false, |slot| {
            let released = rules::release(slot, run_id, fence_token, now_ms());
            Ok(Released {
                released,
                session: slot.view(key),
            })
        })
        .await?;
        commit(tx).await?;
        Ok(released)
    }

    async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        leases::check_owner(&tx, &req.key, req.owner_token.as_ref(), self.partitions).await?;
        let (now, first_seq, session) = apply(&tx, &req.key, false, |slot| {
            let now = now_ms();
            let first_seq = rules::reserve_append(slot, &req, now)?;
            Ok((now, first_seq, slot.view(&req.key)))
        })
        .await?;
        let session = session.ok_or_else(|| StoreError::internal("append left no session"))?;
        let stamped = rules::stamp_entries(&req, first_seq, now);
        let last_seq = first_seq + stamped.len() as u64 - 1;
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
        let tx = begin(&mut client, true).await?;
        let row = fetch_opt(&tx, SELECT_SESSION, &[&query.key.as_str()]).await?;
        let current = row.as_ref().map(slot_from_row).transpose()?;
        let current = current.and_then(|slot| slot.view(&query.key));
        let Some((session_id, known_total)) = rules::history_target(current.as_ref(), &query)
        else {
            return Ok(HistoryPage::default());
        };
        let id = session_id.to_string();
        let total = match known_total {
            Some(total) => total,
            None => match fetch_opt(&tx, TRANSCRIPT_LEN, &[&id]).await? {
                Some(row) => from_db(col(&row, 0)?),
                None => 0,
            },
        };
        // As rules::history_page, whose fetch callback cannot be async.
        let (entries, more) = match rules::history_window(query.cursor, query.limit, total) {
            None => (Vec::new(), false),
            Some((lower, upper, more)) => {
                let rows = fetch(&tx, SELECT_ENTRIES, &[&id, &to_db(lower), &to_db(upper)]).await?;
                let entries = rows.iter().map(entry_from_row);
                (entries.collect::<StoreResult<_>>()?, more)
            }
        };
        commit(tx).await?;
        let (cursor, max_chars) = (query.cursor, query.max_chars);
        Ok(rules::finish_page(
            session_id, cursor, entries, more, max_chars, total,
        ))
    }

    async fn get_session(&self, key: &SessionKey) -> StoreResult<Option<Session>> {
        let client = self.client().await?;
        let row = fetch_opt(&client, SELECT_SESSION, &[&key.as_str()]).await?;
        let slot = row.as_ref().map(slot_from_row).transpose()?;
        Ok(slot.and_then(|slot| slot.view(key)))
    }

    async fn list_sessions(&self, query: ListQuery) -> StoreResult<Vec<Session>> {
        let limit = query.limit as usize;
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let mut client = self.client().await?;
        let tx = begin(&mut client, true).await?;
        // `updated_since_ms` is filtered in SQL exactly. A search term is
        // filtered in Rust by rules::list_matches (ILIKE's case folding
        // depends on the database locale), walking batches newest first.
        let batch = match query.search {
            None => limit.min(4 * LIST_BATCH),
            Some(_) => LIST_BATCH,
        };
        let mut after: Option<(i64, String)> = None;
        loop {
            let (after_ms, after_key) = (after.as_ref().map(|a| a.0), after.map(|a| a.1));
            let params: [&(dyn ToSql + Sync); 4] = [
                &query.updated_since_ms,
                &after_ms,
                &after_key,
                &(batch as i64),
            ];
            let rows = fetch(&tx, LIST_SESSIONS, &params).await?;
            for row in &rows {
                let key = SessionKey::from_stored(col::<String>(row, 0)?);
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
                _ => return Ok(found),
            }
        }
    }

    async fn reset_session(&self, key: &SessionKey) -> StoreResult<ResetOutcome> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        let outcome = apply(&tx, key, true, |slot| {
            Ok(rules::reset(slot, key, now_ms(), Uuid::new_v4()))
        })
        .await?;
        commit(tx).await?;
        Ok(outcome)
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        delete_transcript: bool,
    ) -> StoreResult<DeleteOutcome> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        // The row stays, with its fence counter; only the session goes.
        let outcome = apply(&tx, key, false, |slot| Ok(rules::delete(slot))).await?;
        if let (true, Some(old)) = (delete_transcript, outcome.previous_session_id) {
            run(&tx, DELETE_ENTRIES, &[&old.to_string()]).await?;
        }
        commit(tx).await?;
        Ok(outcome)
    }

    async fn patch_session(&self, req: PatchSession) -> StoreResult<PatchOutcome> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        // The session row is locked FOR UPDATE from the read to the commit,
        // so concurrent patches apply one after the other (none is lost).
        let outcome = apply(&tx, &req.key, req.create, |slot| {
            rules::patch(slot, &req, now_ms(), self.max_settings_bytes, Uuid::new_v4)
        })
        .await?;
        commit(tx).await?;
        Ok(outcome)
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRunOutcome> {
        let mut client = self.urgent_client().await?;
        let tx = begin(&mut client, false).await?;
        let r = rules::new_run_record(&new, now_ms());
        let (session_id, fence) = (
            r.session_id.map(|id| id.to_string()),
            r.fence_token.map(to_db),
        );
        #[rustfmt::skip]
        let params: [&(dyn ToSql + Sync); 15] = [
            &r.run_id, &r.session_key, &r.kind, &r.fingerprint, &r.status.as_str(),
            &to_db(r.version), &r.created_at_ms, &r.updated_at_ms, &r.started_at_ms, &r.ended_at_ms,
            &r.owner, &r.request_json, &r.outcome_json, &session_id, &fence,
        ];
        // The owner check, the settings read and the insert go out together
        // (pipelined on the connection: one round trip, not three). Their
        // order does not matter: all three are in this transaction, which
        // commits only if both checks pass (a refusal drops it, rolling the
        // insert back), and the lease row's share lock, taken before the
        // commit, orders any steal after it. The settings are read unlocked:
        // a patch that commits after the read is ordered after the admission,
        // as if it had come a moment later. A session to create is locked
        // after (lease row, run row, session row: the module's order).
        let key = new.session_key.as_str();
        let token = new.owner_token.as_ref();
        let (owner, session, inserted) = tokio::join!(
            leases::check_owner(&tx, &new.session_key, token, self.partitions),
            async {
                match new.expected_settings {
                    Some(_) if !new.create_session => fetch_opt(&tx, SELECT_SESSION, &[&key]).await,
                    _ => Ok(None),
                }
            },
            run(&tx, INSERT_RUN, &params),
        );
        owner?;
        let mut inserted = inserted? == 1;
        if inserted {
            match new.create_session {
                true => create_session_for_run(&tx, &new).await?,
                false => check_settings_row(session?.as_ref(), &new)?,
            }
        }
        // A record that exists answers whatever the settings. A conflicting
        // record may be purged between the INSERT and the SELECT; then the
        // INSERT is tried again (and the settings read again for it).
        for _ in 0..3 {
            if inserted {
                commit(tx).await?;
                return Ok(CreateRunOutcome {
                    created: true,
                    record: r,
                    fingerprint_mismatch: false,
                });
            }
            if let Some(row) = fetch_opt(&tx, SELECT_RUN, &[&new.run_id]).await? {
                let existing = rules::existing_run(run_from_row(&row)?, &new);
                commit(tx).await?;
                return Ok(existing);
            }
            inserted = run(&tx, INSERT_RUN, &params).await? == 1;
            if inserted && new.create_session {
                create_session_for_run(&tx, &new).await?;
            } else if inserted && new.expected_settings.is_some() {
                let row = fetch_opt(&tx, SELECT_SESSION, &[&key]).await?;
                check_settings_row(row.as_ref(), &new)?;
            }
        }
        let message = format!("run {:?} neither inserted nor found", new.run_id);
        Err(StoreError::Internal(message))
    }

    async fn update_run(&self, update: RunUpdate) -> StoreResult<RunRecord> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        // Lease row first, run row second, session row third (see the module
        // docs). A run's session key never changes, so it is read unlocked to
        // find the partition.
        let Some(row) = fetch_opt(&tx, SELECT_RUN_SESSION, &[&update.run_id]).await? else {
            return Err(StoreError::RunNotFound(update.run_id));
        };
        let key = SessionKey::from_stored(col(&row, 0)?);
        let token = update.owner_token.as_ref();
        leases::check_owner(&tx, &key, token, self.partitions).await?;
        let mut r = lock_run(&tx, &update.run_id).await?;
        rules::update_run(&mut r, &update, now_ms())?;
        store_run(&tx, &r).await?;
        apply(&tx, &key, false, |slot| {
            rules::note_run_status(slot, &r);
            Ok(())
        })
        .await?;
        commit(tx).await?;
        Ok(r)
    }

    async fn start_run(&self, req: StartRun) -> StoreResult<Started> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        // Lease row, run row, session row: the order of UpdateRun.
        leases::check_owner(&tx, &req.key, req.owner_token.as_ref(), self.partitions).await?;
        let mut record = lock_run(&tx, &req.run_id).await?;
        let now = now_ms();
        let (acquired, first_seq) = apply(&tx, &req.key, true, |slot| {
            rules::start_run(&mut record, slot, &req, now, Uuid::new_v4)
        })
        .await?;
        let session_id = acquired.session.session_id;
        let stamped = rules::stamp(&req.entries, &req.run_id, first_seq, now);
        insert_entries(&tx, session_id, &stamped).await?;
        store_run(&tx, &record).await?;
        let total = acquired.session.entry_count;
        let history = match rules::start_history_range(first_seq, total, req.history_limit) {
            Some((lower, upper)) => {
                let range = [
                    &session_id.to_string() as &(dyn ToSql + Sync),
                    &to_db(lower),
                    &to_db(upper),
                ];
                let rows = fetch(&tx, SELECT_ENTRIES, &range).await?;
                rows.iter()
                    .map(entry_from_row)
                    .collect::<StoreResult<_>>()?
            }
            None => Vec::new(),
        };
        // Durable once the commit returns.
        commit(tx).await?;
        Ok(Started {
            record,
            acquired,
            first_seq,
            history,
        })
    }

    async fn finish_run(&self, req: FinishRun) -> StoreResult<Finished> {
        let mut client = self.client().await?;
        let tx = begin(&mut client, false).await?;
        leases::check_owner(&tx, &req.key, req.owner_token.as_ref(), self.partitions).await?;
        let mut record = lock_run(&tx, &req.run_id).await?;
        let now = now_ms();
        let (first_seq, released) = apply(&tx, &req.key, false, |slot| {
            rules::finish_run(&mut record, slot, &req, now)
        })
        .await?;
        if let Some(fence) = req.writer.filter(|_| !req.entries.is_empty()) {
            let stamped = rules::stamp(&req.entries, &req.run_id, first_seq, now);
            insert_entries(&tx, fence.session_id, &stamped).await?;
        }
        store_run(&tx, &record).await?;
        commit(tx).await?;
        Ok(Finished {
            record,
            first_seq,
            released,
        })
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

    async fn acquire_leases(&self, req: AcquireLeases) -> StoreResult<LeaseGrant> {
        let targets = ownership::acquire_targets(&req, self.partitions)?;
        let mut client = self.urgent_client().await?;
        let tx = begin(&mut client, false).await?;
        let grant = leases::apply(&tx, leases::LOCK_FOR_TAKE, &targets, |lease, now| {
            ownership::take(lease, &req, now)
        })
        .await?;
        commit(tx).await?;
        Ok(grant)
    }

    async fn renew_leases(&self, req: RenewLeases) -> StoreResult<LeaseGrant> {
        ownership::check_renew(&req, self.partitions)?;
        let mut tokens = req.tokens.clone();
        tokens.sort_by_key(|t| t.partition);
        let partitions: Vec<u32> = tokens.iter().map(|t| t.partition).collect();
        let mut client = self.urgent_client().await?;
        let tx = begin(&mut client, false).await?;
        let mut next = tokens.iter();
        let grant = leases::apply(&tx, leases::LOCK_FOR_RENEW, &partitions, |lease, now| {
            let token = next.next().expect("one token per locked row");
            ownership::renew(lease, token, req.ttl_ms, now)
        })
        .await?;
        commit(tx).await?;
        Ok(grant)
    }

    async fn release_leases(&self, mut tokens: Vec<OwnerToken>) -> StoreResult<Vec<u32>> {
        ownership::check_tokens(&tokens, None, self.partitions)?;
        tokens.sort_by_key(|t| t.partition);
        let partitions: Vec<u32> = tokens.iter().map(|t| t.partition).collect();
        let mut client = self.urgent_client().await?;
        let tx = begin(&mut client, false).await?;
        let mut next = tokens.iter();
        let grant = leases::apply(&tx, leases::LOCK_FOR_TAKE, &partitions, |lease, now| {
            let token = next.next().expect("one token per locked row");
            ownership::release(lease, token, now)
        })
        .await?;
        commit(tx).await?;
        Ok(grant.granted.iter().map(|l| l.partition).collect())
    }

    async fn list_leases(&self) -> StoreResult<LeaseTable> {
        let client = self.client().await?;
        let (leases, now_ms) = leases::list(&client).await?;
        Ok(LeaseTable {
            partition_count: self.partitions,
            leases,
            now_ms,
        })
    }

    // Registry writes use the admission pool, as lease renewals do: a
    // heartbeat that waited for a connection behind execution writes could
    // let a live member's entry expire.
    async fn heartbeat_member(&self, req: MemberHeartbeat) -> StoreResult<MemberTable> {
        ownership::check_heartbeat(&req)?;
        let mut client = self.urgent_client().await?;
        let tx = begin(&mut client, false).await?;
        let table = members::heartbeat(&tx, &req, self.max_members).await?;
        commit(tx).await?;
        Ok(table)
    }

    async fn leave_member(&self, member: &str) -> StoreResult<bool> {
        ownership::check_member(member)?;
        let client = self.urgent_client().await?;
        members::leave(&client, member).await
    }

    async fn list_members(&self) -> StoreResult<MemberTable> {
        let client = self.client().await?;
        members::list(&client).await
    }
}

#[cfg(test)]
mod tests;

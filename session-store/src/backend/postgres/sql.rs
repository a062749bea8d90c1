//! The PostgreSQL backend's statements (the ownership ones are in `leases.rs`).

// SELECTs of whole rows with fixed column lists, so that decoding goes by index.
macro_rules! select_sessions {
    ($($tail:expr),+) => {
        concat!(
            "SELECT session_key, last_fence, session_id::text, writer_run_id, writer_fence, \
             created_at_ms, updated_at_ms, label, last_run_id, last_run_status, entry_count, \
             settings FROM sessions ", $($tail),+)
    };
}
macro_rules! select_runs {
    ($($tail:expr),+) => {
        concat!(
            "SELECT run_id, session_key, kind, fingerprint, status, version, created_at_ms, \
             updated_at_ms, started_at_ms, ended_at_ms, owner, request_json, outcome_json, \
             session_id::text, fence_token FROM runs ", $($tail),+)
    };
}
/// The non-terminal statuses (`!RunStatus::is_terminal`), spelled like the
/// predicate of the `runs_active_idx` partial index so the planner can use it.
macro_rules! active_statuses {
    () => {
        "('accepted', 'queued', 'running')"
    };
}

pub(super) const SELECT_SESSION: &str = select_sessions!("WHERE session_key = $1");
pub(super) const LOCK_SESSION: &str = select_sessions!("WHERE session_key = $1 FOR UPDATE");
pub(super) const INSERT_SESSION: &str = "INSERT INTO sessions (session_key, last_fence) VALUES ($1, 0) \
     ON CONFLICT (session_key) DO NOTHING";
pub(super) const UPDATE_SESSION: &str = "UPDATE sessions SET last_fence = $2, session_id = $3::text::uuid, \
     writer_run_id = $4, writer_fence = $5, created_at_ms = $6, updated_at_ms = $7, label = $8, \
     last_run_id = $9, last_run_status = $10, entry_count = $11, settings = $12 \
     WHERE session_key = $1";
/// Newest first, ties by key (bytewise, as in Rust); keyset paging after ($2, $3).
pub(super) const LIST_SESSIONS: &str = select_sessions!(
    "WHERE session_id IS NOT NULL AND ($1::bigint IS NULL OR updated_at_ms >= $1) \
     AND ($2::bigint IS NULL OR updated_at_ms < $2 OR (updated_at_ms = $2 AND session_key > $3)) \
     ORDER BY updated_at_ms DESC, session_key LIMIT $4"
);

pub(super) const INSERT_ENTRIES: &str = "INSERT INTO transcript_entries (session_id, seq, role, \
     content_json, timestamp_ms, run_id, stop_reason, usage_json, aborted) \
     SELECT $1::text::uuid, e.* FROM UNNEST($2::bigint[], $3::text[], $4::text[], \
     $5::bigint[], $6::text[], $7::text[], $8::text[], $9::boolean[]) AS e";
pub(super) const SELECT_ENTRIES: &str = "SELECT seq, role, content_json, timestamp_ms, run_id, \
     stop_reason, usage_json, aborted FROM transcript_entries \
     WHERE session_id = $1::text::uuid AND seq BETWEEN $2 AND $3 ORDER BY seq";
/// Seqs run 1..=n without gaps, so the largest one is the transcript's length.
pub(super) const TRANSCRIPT_LEN: &str = "SELECT coalesce(max(seq), 0) FROM transcript_entries \
     WHERE session_id = $1::text::uuid";
pub(super) const DELETE_ENTRIES: &str =
    "DELETE FROM transcript_entries WHERE session_id = $1::text::uuid";

pub(super) const SELECT_RUN: &str = select_runs!("WHERE run_id = $1");
pub(super) const LOCK_RUN: &str = select_runs!("WHERE run_id = $1 FOR UPDATE");
pub(super) const SELECT_RUN_SESSION: &str = "SELECT session_key FROM runs WHERE run_id = $1";
pub(super) const INSERT_RUN: &str = "INSERT INTO runs (run_id, session_key, kind, fingerprint, status, \
     version, created_at_ms, updated_at_ms, started_at_ms, ended_at_ms, owner, request_json, \
     outcome_json, session_id, fence_token) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
     $11, $12, $13, $14::text::uuid, $15) ON CONFLICT (run_id) DO NOTHING";
pub(super) const UPDATE_RUN: &str = "UPDATE runs SET status = $2, version = $3, updated_at_ms = $4, \
     started_at_ms = $5, ended_at_ms = $6, owner = $7, outcome_json = $8, \
     session_id = $9::text::uuid, fence_token = $10 WHERE run_id = $1";
pub(super) const LIST_ACTIVE_RUNS: &str = select_runs!(
    "WHERE status IN ",
    active_statuses!(),
    " AND ($1::text IS NULL OR owner = $1) ORDER BY created_at_ms, run_id"
);
/// `rules::run_expired` as SQL. The rows are locked in run_id order so that
/// concurrent purges from several replicas cannot deadlock.
pub(super) const PURGE_RUNS: &str = concat!(
    "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs WHERE status NOT IN ",
    active_statuses!(),
    " AND ended_at_ms < $1 ORDER BY run_id FOR UPDATE)"
);

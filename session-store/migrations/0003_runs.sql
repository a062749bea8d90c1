-- Run records keyed by runId (= idempotency key). `status` holds
-- RunStatus::as_str. `fence_token` holds the caller's u64 bit for bit (it may
-- read negative here). run_id sorts bytewise (COLLATE "C"), like Rust.
CREATE TABLE runs (
    run_id        text COLLATE "C" PRIMARY KEY,
    session_key   text COLLATE "C" NOT NULL,
    kind          text   NOT NULL,
    fingerprint   text   NOT NULL,
    status        text   NOT NULL CHECK (status IN (
        'accepted', 'queued', 'running', 'ok', 'error', 'aborted', 'timeout',
        'superseded', 'lost')),
    version       bigint NOT NULL CHECK (version >= 1),
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    started_at_ms bigint,
    ended_at_ms   bigint,
    owner         text   NOT NULL,
    request_json  text   NOT NULL,
    outcome_json  text,
    session_id    uuid,
    fence_token   bigint
);

-- ListActiveRuns (oldest first); the predicate is the non-terminal statuses.
CREATE INDEX runs_active_idx ON runs (created_at_ms, run_id)
    WHERE status IN ('accepted', 'queued', 'running');

-- PurgeExpiredRuns.
CREATE INDEX runs_ended_idx ON runs (ended_at_ms) WHERE ended_at_ms IS NOT NULL;

-- One row per session key. Rows are never deleted: a row carries the key's
-- fence counter (`last_fence`), which must never be reused, not even after a
-- reset or a delete. `session_id IS NULL` means the key has no session now
-- (it was deleted); all per-session columns are then NULL / 0.
-- `session_key` sorts bytewise (COLLATE "C"), like Rust's `String` order.
CREATE TABLE sessions (
    session_key     text COLLATE "C" PRIMARY KEY,
    last_fence      bigint NOT NULL DEFAULT 0 CHECK (last_fence >= 0),
    session_id      uuid,
    writer_run_id   text,
    writer_fence    bigint,
    created_at_ms   bigint,
    updated_at_ms   bigint,
    label           text,
    last_run_id     text,
    last_run_status text CHECK (last_run_status IN (
        'accepted', 'queued', 'running', 'ok', 'error', 'aborted', 'timeout',
        'superseded', 'lost')),
    entry_count     bigint NOT NULL DEFAULT 0 CHECK (entry_count >= 0),
    CHECK ((writer_run_id IS NULL) = (writer_fence IS NULL)),
    CHECK ((session_id IS NULL) = (created_at_ms IS NULL)),
    CHECK ((session_id IS NULL) = (updated_at_ms IS NULL)),
    CHECK (session_id IS NOT NULL OR (writer_run_id IS NULL AND label IS NULL
        AND last_run_id IS NULL AND last_run_status IS NULL AND entry_count = 0))
);

-- ListSessions: newest first, ties by key.
CREATE INDEX sessions_updated_idx ON sessions (updated_at_ms DESC, session_key)
    WHERE session_id IS NOT NULL;

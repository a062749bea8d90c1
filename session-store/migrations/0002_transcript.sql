-- Transcript entries per sessionId; seq runs 1..=entry_count of the session
-- row that had this sessionId. No foreign key: a reset gives the key a new
-- sessionId while the old transcript stays (DeleteSession may remove it).
CREATE TABLE transcript_entries (
    session_id   uuid    NOT NULL,
    seq          bigint  NOT NULL CHECK (seq >= 1),
    role         text    NOT NULL,
    content_json text    NOT NULL,
    timestamp_ms bigint  NOT NULL,
    run_id       text    NOT NULL,
    stop_reason  text,
    usage_json   text,
    aborted      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (session_id, seq)
);

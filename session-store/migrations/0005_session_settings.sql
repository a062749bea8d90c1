-- Per-session settings: the client-visible preferences of a session, a JSON
-- object the store treats as opaque (PatchSession merges into it). Kept as
-- text, byte for byte as the store's rules write it (compact, keys sorted),
-- so that every backend returns the same `settings_json`. Existing rows read
-- '{}'. A key without a session (deleted) has none.
ALTER TABLE sessions ADD COLUMN settings text NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD CONSTRAINT sessions_settings_without_session
    CHECK (session_id IS NOT NULL OR settings = '{}');

-- Settings fixed at the store's first start (partition_count).
CREATE TABLE store_settings (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);

-- One lease per partition; every row exists once the store has started (the
-- store inserts them), so a write can always lock its partition's row.
-- `epoch` is bumped by every take and never reused; `expires_at_ms` is by the
-- database's clock.
CREATE TABLE partition_leases (
    partition     integer PRIMARY KEY CHECK (partition >= 0),
    owner         text,
    address       text   NOT NULL DEFAULT '',
    epoch         bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    expires_at_ms bigint NOT NULL DEFAULT 0
);

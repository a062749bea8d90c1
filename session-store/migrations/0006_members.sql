-- The coordinator member registry (placement): one row per coordinator that
-- heartbeats. `expires_at_ms` is by the database's clock, like the leases'; a
-- row at or past it is no member (never answered; the next heartbeat deletes
-- it). Liveness only: partition ownership stays with partition_leases.
CREATE TABLE coordinator_members (
    member        text   PRIMARY KEY,
    address       text   NOT NULL DEFAULT '',
    expires_at_ms bigint NOT NULL
);

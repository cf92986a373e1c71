-- +goose Up
-- Leases that keep one idemd task (a reaper run) from overlapping with
-- another across processes. A row, not a session advisory lock: a session
-- lock belongs to a server connection, and behind a transaction-mode pooler
-- (PgBouncer, cloud proxies) the unlock can run on another server
-- connection and leave the lock held by nobody. A lease is renewed inside
-- the transactions it guards and expires on its own when its holder dies.
CREATE TABLE IF NOT EXISTS idemd_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS idemd_leases;

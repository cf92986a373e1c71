-- The reaper's throttle (issue 43): what a run spent waiting and why, and an
-- operator's pause that every run obeys between batches.
--
-- idemd_reaper_runs gains, per run:
--   throttled_seconds  time the run waited between batches for its replicas,
--                      the primary's load or an operator's pause; added in
--                      the run's own statements as it waits, so a running or
--                      killed run shows it too
--   throttle_reason    the reason of its latest wait: operator, replica_lag,
--                      replica_bytes, wal_rate, commit_latency, signal_error
--   stop_reason        why an incomplete or failed run stopped: max_runtime,
--                      shutdown, critical_load, error; with critical_load the
--                      row's error says which measurement crossed
--                      --critical-load
-- ADD COLUMN with a constant default rewrites nothing (PostgreSQL 11+): it
-- takes the table's lock for an instant, on a table of at most 1000 rows.
--
-- idemd_reaper_pause holds at most one row: while it exists, every reaper
-- run waits before its next batch (reason operator). `idemctl reaper pause`
-- inserts it and `idemctl reaper resume` deletes it, each in the
-- transaction that records the action in idemd_operator_actions (action_id
-- names it), so the pause and its record commit together. A run reads it
-- before every batch: one primary-key lookup. A new, empty table: no
-- CONCURRENTLY needed; the runtime role gets its privileges from
-- deploy/sql/roles.sql's default privileges.
-- +goose Up
ALTER TABLE idemd_reaper_runs
    ADD COLUMN IF NOT EXISTS throttled_seconds DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (throttled_seconds >= 0),
    ADD COLUMN IF NOT EXISTS throttle_reason TEXT,
    ADD COLUMN IF NOT EXISTS stop_reason TEXT;

CREATE TABLE IF NOT EXISTS idemd_reaper_pause (
    singleton BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    paused_by TEXT        NOT NULL CHECK (char_length(btrim(paused_by)) BETWEEN 1 AND 200),
    note      TEXT        NOT NULL CHECK (char_length(btrim(note)) >= 1),
    action_id BIGINT      NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS idemd_reaper_pause;
ALTER TABLE idemd_reaper_runs
    DROP COLUMN IF EXISTS stop_reason,
    DROP COLUMN IF EXISTS throttle_reason,
    DROP COLUMN IF EXISTS throttled_seconds;

-- What each reaper run deletes by (issue 40): idemd_reaper_runs gains, per
-- run, the settings that decide which keys it may delete:
--   retention    its --retention: keys created before now - retention
--   lock_window  its --lock-window: a newer lock is a request in flight
-- idemctl status and the console count keys past retention by the newest
-- run's, not by a flag of their own. NULL for runs of an older release,
-- which did not record them (readers then fall back to their flags); a
-- reaper of the release before this one keeps running on this schema, and
-- this one records without them on a schema before it.
-- ADD COLUMN without a default rewrites nothing: it takes the table's lock
-- for an instant, checking at most 1000 rows.
-- +goose Up
ALTER TABLE idemd_reaper_runs
    ADD COLUMN IF NOT EXISTS retention INTERVAL CHECK (retention > interval '0'),
    ADD COLUMN IF NOT EXISTS lock_window INTERVAL CHECK (lock_window > interval '0');

-- +goose Down
ALTER TABLE idemd_reaper_runs
    DROP COLUMN IF EXISTS lock_window,
    DROP COLUMN IF EXISTS retention;

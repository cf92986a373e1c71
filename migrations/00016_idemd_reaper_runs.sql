-- The reaper's run history (issue 17): one row per run, whatever ran it (the
-- CronJob, a manual run, a --schedule Deployment), so a run's outcome is
-- known without scraping a process that lives for seconds: idemctl status
-- shows the last runs, and a long-running daemon can export the time of the
-- last successful one (runhistory.LastSuccess).
--
-- A run that takes the lease inserts its row at once (finished_at and
-- result NULL), adds each batch's counts in the batch's own transaction,
-- and records its end (finished_at, result, error) in the transaction that
-- releases its lease. So a row without an end whose holder no longer holds
-- the lease is a run that was killed (or lost the database at its end):
-- runhistory.LastRuns calls it interrupted, with the counts of the batches it
-- committed. A run that never took the lease (another run held it, or the
-- database failed first) inserts one finished row at its end. Dry runs
-- change nothing and leave no row.
--
--   mode    once (a CronJob or manual run), schedule (--schedule)
--   result  complete, incomplete (--max-runtime or SIGTERM), lock_held,
--           error (with error: the message the run logged)
--
-- The reaper keeps it bounded: each run that held the lease deletes the
-- rows beyond the newest 1000 and those started more than 30 days ago, so
-- it stays a few hundred kilobytes and needs no index but its primary key.
-- A new, empty table: no CONCURRENTLY needed. The runtime role gets its
-- privileges from deploy/sql/roles.sql's default privileges.
-- +goose Up
CREATE TABLE IF NOT EXISTS idemd_reaper_runs (
    id          BIGSERIAL   PRIMARY KEY,
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ,
    mode        TEXT        NOT NULL CHECK (mode IN ('once', 'schedule')),
    result      TEXT        CHECK (result IN ('complete', 'incomplete', 'lock_held', 'error')),
    deleted     BIGINT      NOT NULL DEFAULT 0 CHECK (deleted >= 0),
    flagged     BIGINT      NOT NULL DEFAULT 0 CHECK (flagged >= 0),
    error       TEXT,
    holder      TEXT        NOT NULL,
    CHECK ((finished_at IS NULL) = (result IS NULL))
);

-- +goose Down
DROP TABLE IF EXISTS idemd_reaper_runs;

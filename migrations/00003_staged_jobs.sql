-- The article's staged_jobs table plus River's insert options. An API that
-- inserts only (job_name, job_args) keeps working: every added column is
-- nullable or defaulted.
-- +goose Up
CREATE TABLE IF NOT EXISTS staged_jobs (
    id       BIGSERIAL PRIMARY KEY,
    job_name TEXT      NOT NULL,
    job_args JSONB     NOT NULL
);

-- Plain INT rather than SMALLINT for priority and max_attempts: an out-of-range
-- value must reach the enqueuer and be dead-lettered with a reason, not fail
-- the API's own transaction.
ALTER TABLE staged_jobs
    ADD COLUMN IF NOT EXISTS created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS queue        TEXT,
    ADD COLUMN IF NOT EXISTS priority     INT,
    ADD COLUMN IF NOT EXISTS max_attempts INT,
    ADD COLUMN IF NOT EXISTS scheduled_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS tags         TEXT[],
    ADD COLUMN IF NOT EXISTS metadata     JSONB;

-- One NOTIFY per inserting statement (not per row), delivered at commit, so
-- the enqueuer wakes the moment staged rows become visible. Payload-free:
-- the enqueuer always reads the table, the notification is only a wake-up.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_staged_jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idemd_staged_jobs', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE OR REPLACE TRIGGER idemd_staged_jobs_notify
    AFTER INSERT ON staged_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemd_staged_jobs_notify();

-- Staged rows that can never become valid River jobs, moved here in the same
-- transaction that takes them out of staged_jobs.
CREATE TABLE IF NOT EXISTS staged_jobs_dead (
    id           BIGINT      PRIMARY KEY, -- the staged_jobs id it had
    created_at   TIMESTAMPTZ NOT NULL,
    job_name     TEXT        NOT NULL,
    job_args     JSONB       NOT NULL,
    queue        TEXT,
    priority     INT,
    max_attempts INT,
    scheduled_at TIMESTAMPTZ,
    tags         TEXT[],
    metadata     JSONB,
    reason       TEXT        NOT NULL,
    dead_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS staged_jobs_dead;
DROP TRIGGER IF EXISTS idemd_staged_jobs_notify ON staged_jobs;
DROP FUNCTION IF EXISTS idemd_staged_jobs_notify();

-- The staged_jobs NOTIFY carries the lowest id its statement inserted, so
-- the enqueuer's drain starts there instead of at the start of the primary
-- key (docs/enqueuer.md, "Where a drain starts"). Every row the enqueuer
-- moved leaves a dead index entry at the low end of staged_jobs_pkey until
-- VACUUM removes it, and VACUUM cannot while any transaction holds a
-- snapshot older than the delete (a report, a pg_dump, an idle-in-transaction
-- session): a take that starts at the lowest id walks all of them, and its
-- cost grows with the snapshot's age. A take that starts at the id it was
-- told about walks only what was staged since.
--
-- Still one NOTIFY per statement (a statement-level trigger, now with a
-- transition table to read the statement's ids), delivered at commit, with
-- a payload of one decimal number. A later statement of the same
-- transaction whose ids are all above one already notified sends nothing
-- (the earlier notification, delivered at the same commit, covers them);
-- the transaction-local setting that remembers it is rolled back with a
-- savepoint, as the notification is. A statement that inserted nothing
-- (INSERT ... ON CONFLICT DO NOTHING, INSERT ... SELECT of no rows) sends
-- nothing.
--
-- Compatible both ways during a rollout: an older enqueuer ignores the
-- payload, and a newer enqueuer treats a payload that is not a number (the
-- old trigger's '') as "start at the beginning", which is what it did
-- before.
-- +goose Up
DROP TRIGGER IF EXISTS idemd_staged_jobs_notify ON staged_jobs;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_staged_jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    low  bigint;
    sent bigint;
BEGIN
    SELECT min(id) INTO low FROM idemd_inserted;
    IF low IS NULL THEN
        RETURN NULL;
    END IF;
    sent := nullif(current_setting('idemd.staged_jobs_notified', true), '')::bigint;
    IF sent IS NOT NULL AND sent <= low THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('idemd.staged_jobs_notified', low::text, true);
    PERFORM pg_notify('idemd_staged_jobs', low::text);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER idemd_staged_jobs_notify
    AFTER INSERT ON staged_jobs
    REFERENCING NEW TABLE AS idemd_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION idemd_staged_jobs_notify();

-- +goose Down
DROP TRIGGER IF EXISTS idemd_staged_jobs_notify ON staged_jobs;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_staged_jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idemd_staged_jobs', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER idemd_staged_jobs_notify
    AFTER INSERT ON staged_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemd_staged_jobs_notify();

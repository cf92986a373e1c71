-- The staged_jobs wake-up, decided at commit: a transaction that stages
-- rows notifies the enqueuer only when no enqueuer is already polling for
-- them (docs/enqueuer.md, "How the enqueuer is woken").
--
-- Why not a NOTIFY per commit: PostgreSQL serialises the commits of
-- transactions that queued a NOTIFY (each takes one database-wide lock
-- before its commit record and holds it until the record is flushed), so
-- such commits cannot share a WAL flush with one another. An API whose
-- every request stages a job stopped at one flush per commit, a quarter
-- of what the same transaction commits without the NOTIFY at 32 clients.
--
-- The protocol, with two advisory locks keyed on this table's oid (the
-- enqueuer computes the same keys from 'staged_jobs'::regclass):
--
--   polling (P): the enqueuer that drains holds it, exclusively, on a
--     session of its own while it polls staged_jobs every few
--     milliseconds under a stream of commits. The trigger only probes it.
--   handoff (H): a transaction that skipped its notification because P
--     was held holds H, shared, until it ends. The enqueuer stops polling
--     by taking H exclusively, releasing P and then H, and draining once
--     more: by then every transaction that skipped its notification has
--     committed or rolled back, and every later one notifies.
--
-- The trigger is a deferred constraint trigger, so the decision is made at
-- commit (H is held only for the commit itself, and the enqueuer's handoff
-- never waits for a request that is still running) and it sees each row's
-- id: the notification carries the lowest id the transaction staged, where
-- the enqueuer's drain starts (migration 00015's contract, unchanged).
-- A later row with a lower id (an explicit id) notifies again. A
-- transaction whose trigger cannot take H (the enqueuer is handing off)
-- notifies, as does every transaction while no enqueuer holds P: an
-- enqueuer of an earlier release, which never polls, is woken exactly as
-- before, and one of this release is woken the same way at everyday rates.
--
-- pg_try_advisory_xact_lock_shared never waits: staging never blocks on
-- the enqueuer.
-- +goose Up
DROP TRIGGER IF EXISTS idemd_staged_jobs_notify ON staged_jobs;
DROP FUNCTION IF EXISTS idemd_staged_jobs_notify();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_staged_jobs_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sent bigint;
BEGIN
    -- x'1d3e0001' and x'1d3e0002' name P and H (internal/enqueuer, poll.go).
    -- P is only probed, never kept: a transaction that notifies waits at
    -- commit for the flushes of the others that notify, and holding P
    -- through that wait would keep the enqueuer from taking it.
    IF pg_try_advisory_lock_shared((x'1d3e0001'::bigint << 32) | TG_RELID::bigint) THEN
        PERFORM pg_advisory_unlock_shared((x'1d3e0001'::bigint << 32) | TG_RELID::bigint);
    ELSIF pg_try_advisory_xact_lock_shared((x'1d3e0002'::bigint << 32) | TG_RELID::bigint) THEN
        RETURN NULL;
    END IF;
    sent := nullif(current_setting('idemd.staged_jobs_notified', true), '')::bigint;
    IF sent IS NOT NULL AND sent <= NEW.id THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('idemd.staged_jobs_notified', NEW.id::text, true);
    PERFORM pg_notify('idemd_staged_jobs', NEW.id::text);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER idemd_staged_jobs_wake
    AFTER INSERT ON staged_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION idemd_staged_jobs_wake();

-- +goose Down
DROP TRIGGER IF EXISTS idemd_staged_jobs_wake ON staged_jobs;
DROP FUNCTION IF EXISTS idemd_staged_jobs_wake();

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

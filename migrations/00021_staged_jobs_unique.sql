-- River's unique jobs through staging: a staged row may carry the unique
-- key and states River's own insert would have given the job
-- (rivertype.JobInsertParams.UniqueKey and UniqueStates), and the
-- enqueuer's move writes them to river_job with River's ON CONFLICT, so
-- where InsertTx keeps one job, staging keeps one job (docs/enqueuer.md,
-- "Unique jobs"). idem.StageInsertTx fills them from River's UniqueOpts; an
-- API in another language writes them as its River client would
-- (docs/languages/README.md). Both NULL: not unique, as before.
--
-- Both columns are nullable and without a default: adding them is a
-- catalog change only (no table rewrite), under a lock held for that
-- moment (--ddl-lock-timeout), and an API or enqueuer of an earlier
-- release, which names its columns, is unaffected.
--
-- staged_jobs_dead gets the same two columns, so a dead-lettered row keeps
-- everything it was staged with and `idemctl dead requeue` puts it back
-- whole.
-- +goose Up
ALTER TABLE staged_jobs
    ADD COLUMN IF NOT EXISTS unique_key    BYTEA,
    ADD COLUMN IF NOT EXISTS unique_states BIT(8);
ALTER TABLE staged_jobs_dead
    ADD COLUMN IF NOT EXISTS unique_key    BYTEA,
    ADD COLUMN IF NOT EXISTS unique_states BIT(8);

-- The move's own check that it wrote a River job (or found River's unique
-- job) for every row it deleted: called with the two counts inside the
-- move's statement, it raises when they differ, which aborts the statement
-- and with it the move's transaction, so the rows stay staged. A trigger
-- on river_job that drops an insert (BEFORE INSERT ... RETURN NULL) would
-- otherwise turn a staged row into nothing: neither a River job nor a dead
-- row. The SQLSTATE is outside the data-exception classes (22, 23), so the
-- enqueuer fails the batch loudly instead of dead-lettering its rows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_move_check(taken bigint, written bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF taken IS DISTINCT FROM written THEN
        RAISE EXCEPTION 'idemd move: % staged rows taken but % River jobs written or found', taken, written
            USING ERRCODE = 'P0001',
                  HINT = 'a trigger or rule on river_job dropped an insert; the rows stay in staged_jobs';
    END IF;
    RETURN written;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS idemd_move_check(bigint, bigint);
ALTER TABLE staged_jobs_dead DROP COLUMN IF EXISTS unique_states, DROP COLUMN IF EXISTS unique_key;
ALTER TABLE staged_jobs DROP COLUMN IF EXISTS unique_states, DROP COLUMN IF EXISTS unique_key;

-- River's GIN indexes on river_job (args, metadata) without a pending list.
--
-- With fastupdate on (PostgreSQL's default), a GIN index collects new
-- entries in a pending list and the insert that finds the list past
-- gin_pending_list_limit (4 MB) merges all of it into the index, on its
-- own time. Where an API inserts its River jobs itself, that cost falls on
-- one of many requests now and then. Through idemd one process inserts
-- every job: the enqueuer's drainer. At a few thousand staged jobs a
-- second the list filled every four seconds or so, and the move that met
-- it spent a third of a second merging it while every row behind it
-- waited (docs/benchmarks/enqueuer.md: commit to River p99 200-270 ms at
-- 32 clients, 86 ms without the pending list). Without it each insert pays
-- its own entries, a little more per move and no stall.
--
-- ALTER INDEX ... SET (fastupdate) locks the index ACCESS EXCLUSIVE for
-- the moment of a catalog update: inserts into river_job wait for it that
-- long, and it waits for theirs at most --ddl-lock-timeout before migrate
-- retries. Entries already pending stay in the list until the next VACUUM
-- of river_job merges them. IF EXISTS: an index River has not created, or
-- has renamed, is left alone. `idemctl migrate` sets the option again on
-- every run wherever it is missing (internal/migrate), for an index a
-- River upgrade rebuilds.
--
--
-- Only an index the migrating role owns (or may act as the owner of) is
-- changed: where River was installed by the API's own role, River's
-- tables are its owner's, and this migration leaves them as they are
-- (docs/operations.md says what the owner may run instead).
-- +goose Up
-- +goose StatementBegin
DO $fastupdate$
DECLARE
    ix regclass;
BEGIN
    FOREACH ix IN ARRAY ARRAY[to_regclass('river_job_args_index'), to_regclass('river_job_metadata_index')] LOOP
        IF ix IS NOT NULL AND pg_catalog.pg_has_role(current_user,
               (SELECT relowner FROM pg_catalog.pg_class WHERE oid = ix), 'USAGE') THEN
            EXECUTE format('ALTER INDEX %s SET (fastupdate = off)', ix);
        END IF;
    END LOOP;
END
$fastupdate$;
-- +goose StatementEnd

-- +goose Down
ALTER INDEX IF EXISTS river_job_args_index RESET (fastupdate);
ALTER INDEX IF EXISTS river_job_metadata_index RESET (fastupdate);

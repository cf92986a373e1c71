-- What idemd's roles need on River's tables where River was installed
-- before idemd by another role (the API's, with River's own migrations)
-- and stays that role's: `idemctl migrate` then leaves River to it
-- (docs/operations.md, "River installed by the API"). Run it as River's
-- owner, after deploy/sql/roles.sql, and again after each River upgrade
-- that adds a table (it is idempotent):
--
--   psql "postgres://<river's owner>@db.internal:5432/app" -v ON_ERROR_STOP=1 -f deploy/sql/river-grants.sql
--
-- idemd_runtime (the enqueuer, and idemctl's status and console):
--   river_job        SELECT, INSERT, UPDATE: the enqueuer inserts jobs, and
--                    a unique job's duplicate is found with River's own
--                    INSERT ... ON CONFLICT DO UPDATE (UPDATE); status and
--                    the console count and read jobs.
--   river_job_id_seq USAGE: a job's id.
--   river_migration  SELECT: the enqueuer's River schema gate reads River's
--                    version before it writes river_job.
-- idemd_migrator:
--   river_migration  SELECT: `idemctl migrate` reports River's version.
-- Nothing else: idemd never deletes River's jobs, never alters River's
-- tables, and never runs River's migrations on tables it does not own.

DO $river$
BEGIN
    IF to_regrole('idemd_runtime') IS NULL OR to_regrole('idemd_migrator') IS NULL THEN
        RAISE EXCEPTION 'idemd roles missing: run deploy/sql/roles.sql first';
    END IF;
    IF to_regclass('river_job') IS NULL OR to_regclass('river_migration') IS NULL THEN
        RAISE EXCEPTION 'River''s tables are not on this role''s search path: run it where River is installed';
    END IF;
END
$river$;

GRANT SELECT, INSERT, UPDATE ON river_job TO idemd_runtime;
GRANT USAGE ON SEQUENCE river_job_id_seq TO idemd_runtime;
GRANT SELECT ON river_migration TO idemd_runtime, idemd_migrator;

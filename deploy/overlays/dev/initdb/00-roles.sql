-- idemd's database roles, least privilege, for managed PostgreSQL (RDS,
-- Cloud SQL, Azure) as well as a self-run server. PostgreSQL 14 and later.
--
-- Run it connected to the application's database, as the database's owner
-- or the provider's admin role (rds_superuser, cloudsqlsuperuser, ...: a
-- role with CREATEROLE that owns the database; no superuser needed):
--
--   psql "postgres://admin@db.internal:5432/app" -v ON_ERROR_STOP=1 -f deploy/sql/roles.sql
--
-- Run it once, before the first `idemctl migrate`. The grants on idemd's
-- tables (the API group's, the append-only audit table) are not here: the
-- tables exist only after a migration, and `idemctl migrate` applies them
-- itself as their owner after every run (deploy/sql/grants.sql), so a first
-- install and every upgrade end with the same grants and nobody reruns this
-- file. It is idempotent: running it again changes nothing. Then give the
-- login roles a password (or your provider's IAM login):
--
--   ALTER ROLE idemd_migrator PASSWORD '...';
--   ALTER ROLE idemd_runtime  PASSWORD '...';
--
-- Roles:
--   idemd_migrator  `idemctl migrate`. Owns idemd's and River's tables,
--                   sequences, functions and indexes; CREATE on schema public;
--                   grants the two roles below their privileges on them.
--   idemd_runtime   enqueuer, completer, reaper, and idemctl (status,
--                   review, keys, dead, console).
--                   SELECT/INSERT/UPDATE/DELETE on the migrator's tables,
--                   except the audit table idemd_operator_actions: only
--                   SELECT/INSERT there (append-only, see $existing$ below).
--                   USAGE/SELECT on its sequences, EXECUTE on its functions.
--                   No CREATE on the database or any schema, owns nothing.
--   idemd_api       NOLOGIN group for the API that uses idemd (package idem):
--                   GRANT idemd_api TO <your API's login role>. What it needs
--                   on idemd's tables; its own tables are yours.
--
-- Tests (internal/testing/dbtest) apply this very file to every test database and
-- run the suites as idemd_runtime, so a privilege a daemon needs and this
-- file does not grant fails the tests.

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['idemd_migrator', 'idemd_runtime', 'idemd_api'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                -- No password: a role without one cannot log in with
                -- password authentication until ALTER ROLE ... PASSWORD.
                EXECUTE format('CREATE ROLE %I %s NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS',
                               r, CASE WHEN r = 'idemd_api' THEN 'NOLOGIN' ELSE 'LOGIN' END);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                -- Created meanwhile by a concurrent run (two sessions can
                -- both see it missing): the role exists, which is the goal.
                NULL;
            END;
        END IF;
    END LOOP;

    -- ALTER DEFAULT PRIVILEGES FOR ROLE idemd_migrator below needs the
    -- privileges of idemd_migrator. A superuser has them; a provider's admin
    -- role (CREATEROLE, not superuser) becomes a member for that.
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
       AND NOT pg_catalog.pg_has_role(current_user, 'idemd_migrator', 'USAGE') THEN
        EXECUTE format('GRANT idemd_migrator TO %I', current_user);
    END IF;
END
$roles$;

-- CONNECT (and nothing else) on this database. CREATE ON DATABASE is not
-- needed even by the migrator: idemd and River create no schema, only
-- objects in public. TEMPORARY is not needed: no component uses temp tables.
DO $db$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO idemd_migrator, idemd_runtime, idemd_api', current_database());
END
$db$;

-- PostgreSQL 14 and earlier grant CREATE on schema public to PUBLIC (every
-- role), so without this the runtime role could create tables; 15 and later
-- no longer do, and the REVOKE changes nothing there. Another role of yours
-- that creates tables in public needs its own GRANT CREATE afterwards.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO idemd_migrator;
GRANT USAGE ON SCHEMA public TO idemd_runtime, idemd_api;

-- Every table, sequence and function the migrator creates from now on (each
-- later idemd or River migration) is granted to the runtime at creation;
-- `idemctl migrate` then applies the per-table exceptions (grants.sql).
-- River's functions and idemd's trigger function are EXECUTE to PUBLIC by
-- default already; the explicit grant keeps working where an admin revoked
-- that default.
ALTER DEFAULT PRIVILEGES FOR ROLE idemd_migrator IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO idemd_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE idemd_migrator IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO idemd_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE idemd_migrator IN SCHEMA public
    GRANT EXECUTE ON FUNCTIONS TO idemd_runtime, idemd_api;

-- The reaper sets wal_compression for its own batch transactions (half the
-- WAL with lz4, docs/reaper.md). It is a superuser parameter; PostgreSQL 15
-- can grant setting it. Optional: where this is refused (PostgreSQL 14, or a
-- provider whose admin may not grant it) the reaper logs once and runs with
-- the server's setting.
DO $walc$
BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        BEGIN
            EXECUTE 'GRANT SET ON PARAMETER wal_compression TO idemd_runtime';
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'could not grant SET ON PARAMETER wal_compression to idemd_runtime (%); the reaper will use the server''s setting', SQLERRM;
        END;
    END IF;
END
$walc$;

-- The reaper's throttle reads its replicas' replay positions from
-- pg_stat_replication on the primary (docs/reaper.md, "The throttle"):
-- PostgreSQL shows them only to members of pg_read_all_stats (which
-- pg_monitor includes), to anyone else every column but the pid is NULL and
-- the reaper refuses to run blind. The completer's database-wide gauges
-- time what holds the vacuum horizon back from pg_stat_activity, whose
-- xact_start and backend_start of other roles' sessions (the API's) the
-- same role alone shows; backend_xmin and application_name every role
-- sees (docs/operations.md, IdemdDbStatsWithoutReadAllStats).
-- pg_read_all_stats is the narrowest role that shows them: it reads
-- statistics views, no data and no settings. Optional: where this is
-- refused (a provider whose admin may not grant it), grant it as the
-- provider says, or run the reaper with --max-lag 0 --max-lag-bytes 0 and
-- watch the replicas another way; the horizon's holders of other roles are
-- then exported by their age in transactions only.
DO $stats$
BEGIN
    EXECUTE 'GRANT pg_read_all_stats TO idemd_runtime';
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'could not grant pg_read_all_stats to idemd_runtime (%); the reaper cannot see the replicas'' lag (docs/reaper.md), the completer cannot time other roles'' snapshots (docs/operations.md)', SQLERRM;
END
$stats$;

-- Two login roles for idemd's daemons and idemctl, used in turn by a
-- rotation that never refuses a login (docs/operations.md, "Credentials
-- that rotate"): each rotation sets a new password on the role the Secret
-- does not name, then writes the Secret's username and password together;
-- the daemons read both with --database-user-file and
-- --database-password-file. Run once, as the admin role, after roles.sql:
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/sql/runtime-roles-in-turn.sql
--
-- Both are members of idemd_runtime, which holds every privilege (grants
-- and default privileges name idemd_runtime, never them), so either can do
-- all the daemons do and nothing more. Neither has a password until the
-- first rotation sets one (ALTER ROLE idemd_runtime_a PASSWORD '...').
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['idemd_runtime_a', 'idemd_runtime_b'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS IN ROLE idemd_runtime', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by a concurrent run
            END;
        END IF;
    END LOOP;
END
$roles$;

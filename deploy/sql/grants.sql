-- The grants on idemd's and River's tables, applied by `idemctl migrate`
-- at the end of every run, as the tables' owner (idemd_migrator), so a first
-- install and every upgrade end with the same grants and no step is left
-- to a person. roles.sql (run once, before the first migration) creates the
-- roles and the default privileges; this file grants what only exists after
-- a migration, and takes back what the default privileges give a table
-- that must not have it. An owner may grant and revoke on its own tables:
-- no CREATEROLE, no admin role.
--
-- It does nothing where roles.sql never ran (no idemd_runtime or
-- idemd_api), and grants only on tables the running role owns or may act
-- as the owner of: a migration run as another role (a superuser in a test
-- cluster) still works. Idempotent; safe to run by hand too:
--
--   psql "postgres://idemd_migrator@db.internal:5432/app" -v ON_ERROR_STOP=1 -f deploy/sql/grants.sql

DO $existing$
DECLARE
    t text;
BEGIN
    IF to_regrole('idemd_runtime') IS NULL OR to_regrole('idemd_api') IS NULL
       OR to_regrole('idemd_migrator') IS NULL THEN
        RAISE NOTICE 'idemd roles missing (deploy/sql/roles.sql not run): no grants applied';
        RETURN;
    END IF;

    -- What the migrator owns from before the default privileges existed
    -- (a database migrated before roles.sql ran and handed over with ALTER
    -- TABLE ... OWNER TO idemd_migrator).
    -- And idemd's and River's own tables, by name, wherever a role the
    -- running one may act as owns them: a migrate run as another role
    -- (the API's owner, which also owns River's tables it migrated) gets
    -- no default privileges for idemd_runtime, and without this the
    -- daemons would be refused idemd's tables. No other table of that
    -- role (the API's own) is granted.
    FOR t IN SELECT format('%I.%I', n.nspname, c.relname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
                AND (c.relowner = 'idemd_migrator'::regrole
                     OR c.relname IN ('idempotency_keys', 'idempotency_key_reviews', 'staged_jobs', 'staged_jobs_dead')
                     OR c.relname LIKE 'idemd\_%' OR c.relname LIKE 'river\_%')
                AND pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s TO idemd_runtime', t);
    END LOOP;
    FOR t IN SELECT format('%I.%I', n.nspname, c.relname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' AND c.relkind = 'S'
                AND (c.relowner = 'idemd_migrator'::regrole
                     OR c.relname IN ('idempotency_keys_id_seq', 'idempotency_key_reviews_id_seq', 'staged_jobs_id_seq')
                     OR c.relname LIKE 'idemd\_%' OR c.relname LIKE 'river\_%')
                AND pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') LOOP
        EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO idemd_runtime', t);
    END LOOP;

    -- The API (package idem) locks, creates and updates keys and stages
    -- jobs in its own transactions; it never deletes keys (the reaper does)
    -- and never reads River. REFERENCES lets the API's own tables point at a
    -- key, as Rocket Rides' rides.idempotency_key_id does.
    IF to_regclass('public.idempotency_keys') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE, REFERENCES ON public.idempotency_keys TO idemd_api;
        GRANT USAGE, SELECT ON SEQUENCE public.idempotency_keys_id_seq TO idemd_api;
    END IF;
    IF to_regclass('public.staged_jobs') IS NOT NULL THEN
        GRANT SELECT, INSERT ON public.staged_jobs TO idemd_api;
        GRANT USAGE, SELECT ON SEQUENCE public.staged_jobs_id_seq TO idemd_api;
    END IF;
    -- The API's replay verifier (idem.ReplayNonces) records each accepted
    -- nonce with INSERT ... ON CONFLICT (nonce) DO NOTHING (which needs
    -- SELECT on the conflict column) and deletes batches of expired rows
    -- (SELECT for their WHERE); it never updates a row.
    IF to_regclass('public.idemd_replay_nonces') IS NOT NULL THEN
        GRANT SELECT, INSERT, DELETE ON public.idemd_replay_nonces TO idemd_api;
    END IF;

    -- The operators' audit table (migration 00017) is append-only for the
    -- runtime role, which idemctl and the console run as: an action is
    -- recorded with INSERT in the transaction that performs it and read
    -- back with SELECT, and no idemd component updates or deletes a record,
    -- so a compromised or buggy daemon cannot rewrite who did what. The
    -- default privileges (roles.sql) cannot except one table: the migration
    -- that creates it grants the runtime UPDATE and DELETE like every other
    -- table's, and this REVOKE, after the GRANT loop above, takes them back
    -- in the same `idemctl migrate` run, before it reports success. Only the
    -- migrator (the owner) can still change the records.
    -- The API group has never been granted anything on it.
    IF to_regclass('public.idemd_operator_actions') IS NOT NULL THEN
        REVOKE UPDATE, DELETE, TRUNCATE ON public.idemd_operator_actions FROM idemd_runtime, idemd_api;
        GRANT SELECT, INSERT ON public.idemd_operator_actions TO idemd_runtime;
    END IF;
END
$existing$;


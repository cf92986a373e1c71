-- Development only: the passwords of the login roles that the overlay's
-- generated Secret idemd-database puts in its URLs (kustomization.yaml).
-- The postgres image runs this after 00-roles.sql (a copy of
-- deploy/sql/roles.sql) when it initialises an empty data directory.
ALTER ROLE idemd_migrator PASSWORD 'idemd';
ALTER ROLE idemd_runtime PASSWORD 'idemd';

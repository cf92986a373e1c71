-- Indexes are built CONCURRENTLY so that migrating a database whose API is
-- already serving traffic never blocks its writes to idempotency_keys.
-- +goose NO TRANSACTION
-- +goose Up
-- The article's unique index, under the article's name so it is not duplicated.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_user_id_idempotency_key
    ON idempotency_keys (user_id, idempotency_key);

-- Reaper: keys past retention, in created_at order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_created_at
    ON idempotency_keys (created_at);

-- The completer's partial index idempotency_keys_unfinished that stood
-- here named recovery_point, which the API updates in every phase, so none
-- of its updates could be a HOT update. 00012 replaces it with a side table
-- (and drops it where it was created); a new installation never builds it.

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_unfinished;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_created_at;

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

-- Completer: the few unfinished keys it may still work on. Partial, so it
-- stays tiny however large the table grows.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unfinished
    ON idempotency_keys (created_at)
    WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_unfinished;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_created_at;

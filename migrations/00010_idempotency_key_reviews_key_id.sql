-- The reaper flags a key at deletion only when it has no review for that
-- reason yet, open or resolved (a human who resolved the completer's review
-- must not see the key again). That check looks reviews up by key_id, which
-- the partial unique index on open reviews cannot answer for resolved ones.
-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_key_reviews_key_id
    ON idempotency_key_reviews (key_id, reason);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_key_reviews_key_id;

-- The completer's candidates, found without indexing any column the API
-- updates while it serves a request (see migrations.APIUpdatedColumns and
-- docs/completer.md, "How candidates are found").
--
-- 00002's partial index idempotency_keys_unfinished (created_at) WHERE
-- recovery_point <> 'finished' AND completer_gave_up_at IS NULL named
-- recovery_point in its predicate. Every phase of every request changes
-- recovery_point, and an UPDATE that changes a column an index depends on
-- cannot be a HOT update: it writes a new entry into every index of the
-- table, the primary key and the (user_id, idempotency_key) index included,
-- and the API's SERIALIZABLE phases, which read those indexes, then
-- conflict far more often (measured: 0 % HOT updates and a 55 % failure
-- rate, against the article schema's 99 % and 0.1 %).
--
-- Instead, a trigger records every key inserted unfinished in
-- idemd_unfinished_keys, in the API's own INSERT, whatever language the API
-- is written in. The trigger only inserts: it reads nothing, so it adds no
-- predicate lock the API's SERIALIZABLE transactions could conflict on, and
-- the API's UPDATEs fire nothing at all. The table is a superset of the
-- unfinished keys: the completer deletes the rows of keys that finished,
-- were given up, or were deleted (as it sees them, and in a periodic prune),
-- so it stays about as small as the backlog.
--
-- Online, for an installation whose API is serving: the table and the
-- trigger come first, then the backfill of the keys unfinished right now
-- (using the old partial index, still there), idempotent with ON CONFLICT
-- DO NOTHING so a key the trigger already recorded is skipped; CREATE
-- TRIGGER waits for in-flight INSERTs to commit, so every key is either
-- visible to the backfill or recorded by the trigger. Only then is the old
-- index dropped, CONCURRENTLY.
-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS idemd_unfinished_keys (
    -- The key's created_at when it was inserted: the completer walks this
    -- table in this order and stops at its grace period.
    created_at TIMESTAMPTZ NOT NULL,
    key_id     BIGINT      NOT NULL, -- idempotency_keys.id; no FK: the reaper deletes keys
    PRIMARY KEY (created_at, key_id)
);

-- SECURITY DEFINER: the API's database role needs no privilege on this
-- table. The search_path is pinned to the migration's, as for any
-- SECURITY DEFINER function.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemd_track_unfinished_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO idemd_unfinished_keys (created_at, key_id)
    VALUES (NEW.created_at, NEW.id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE OR REPLACE TRIGGER idemd_track_unfinished_key
    AFTER INSERT ON idempotency_keys
    FOR EACH ROW WHEN (NEW.recovery_point <> 'finished')
    EXECUTE FUNCTION idemd_track_unfinished_key();

INSERT INTO idemd_unfinished_keys (created_at, key_id)
SELECT created_at, id FROM idempotency_keys
WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL
ON CONFLICT DO NOTHING;

DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_unfinished;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unfinished
    ON idempotency_keys (created_at)
    WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL;
DROP TRIGGER IF EXISTS idemd_track_unfinished_key ON idempotency_keys;
DROP FUNCTION IF EXISTS idemd_track_unfinished_key();
DROP TABLE IF EXISTS idemd_unfinished_keys;

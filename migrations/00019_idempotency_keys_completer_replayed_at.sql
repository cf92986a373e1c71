-- When the completer last wrote a failed replay of the key (the database's
-- clock). The API sets last_run_at when a request takes the key, the
-- completer's replays included, and --idle leaves a key alone that long
-- after its last run so that a client's own retries go first. A run that
-- started before this time was the completer's own replay (or a request
-- that had ended by then), so it does not hold the key's retry back for
-- --idle: the retry backoff decides.
--
-- +goose Up
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS completer_replayed_at TIMESTAMPTZ;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS completer_replayed_at;

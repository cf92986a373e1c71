-- The nonces of accepted replay signatures (idem/replayauth, the
-- completer's signed path into the API), shared by every API replica: a
-- nonce one replica accepted is refused by all the others, which a
-- per-process memory cannot do (issue 16, part 3).
--
-- idem.ReplayNonces records a nonce with one atomic
--   INSERT ... ON CONFLICT (nonce) DO NOTHING
-- (one row inserted: fresh; none: a replay) and expires_at, the time its
-- signature stops passing the verifier's skew window (its timestamp + the
-- window). Each API process deletes a bounded batch of rows expired for
-- longer than a grace period about once a minute, through the index on
-- expires_at, and at once again while batches come back full, so the table
-- holds about (accepted replays per second) × (window + grace + a minute)
-- rows and has no capacity that could refuse a valid replay.
--
-- A new, empty table: no CONCURRENTLY needed. The API's role (idemd_api)
-- gets SELECT, INSERT, DELETE on it from deploy/sql/roles.sql.
-- +goose Up
CREATE TABLE IF NOT EXISTS idemd_replay_nonces (
    nonce      text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS idemd_replay_nonces_expires_at ON idemd_replay_nonces (expires_at);

-- +goose Down
DROP TABLE IF EXISTS idemd_replay_nonces;

-- What operators did to keys and dead-lettered staged jobs (issue 20): who,
-- when, why, and what the row was before. One row per action, written in
-- the transaction that performs it, so an action and its record commit
-- together or not at all. Review resolutions are recorded in
-- idempotency_key_reviews itself (resolved_by, resolved_at,
-- resolution_note); a retry that resolves a key's open review records the
-- review's id here as well.
--
-- Actions (internal/console):
--   key_retry     a given-up or flagged key handed back to the completer
--                 (detail: the completer's columns before the reset)
--   dead_requeue  a dead-lettered staged job moved back into staged_jobs
--                 (detail: the staged_jobs_dead row as it was)
--
-- No foreign keys: keys are reaped and dead letters leave their table, and
-- the record must outlive both. A new, empty table: no CONCURRENTLY needed.
-- +goose Up
CREATE TABLE IF NOT EXISTS idemd_operator_actions (
    id            BIGSERIAL   PRIMARY KEY,
    at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor         TEXT        NOT NULL CHECK (char_length(btrim(actor)) BETWEEN 1 AND 200),
    action        TEXT        NOT NULL CHECK (char_length(action) BETWEEN 1 AND 50),
    via           TEXT        NOT NULL CHECK (char_length(via) BETWEEN 1 AND 50), -- idemctl, console
    key_id        BIGINT,
    review_id     BIGINT,
    staged_job_id BIGINT,
    note          TEXT        NOT NULL CHECK (char_length(btrim(note)) >= 1),
    detail        JSONB       NOT NULL DEFAULT '{}'
);

-- idemctl keys show and the console's key page list a key's actions, the
-- dead-letter pages a staged job's.
CREATE INDEX IF NOT EXISTS idemd_operator_actions_key_id
    ON idemd_operator_actions (key_id) WHERE key_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS idemd_operator_actions_staged_job_id
    ON idemd_operator_actions (staged_job_id) WHERE staged_job_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS idemd_operator_actions_at
    ON idemd_operator_actions (at);

-- +goose Down
DROP TABLE IF EXISTS idemd_operator_actions;

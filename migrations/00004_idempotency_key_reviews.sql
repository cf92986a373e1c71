-- Keys a human must look at: unfinished at the retention horizon, or given up
-- by the completer. A full snapshot of the key row is kept because the key
-- itself may be deleted right after it is flagged.
-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_key_reviews (
    id              BIGSERIAL   PRIMARY KEY,
    key_id          BIGINT      NOT NULL, -- no FK: the key may be reaped
    user_id         BIGINT      NOT NULL,
    idempotency_key TEXT        NOT NULL,
    reason          TEXT        NOT NULL CHECK (char_length(reason) BETWEEN 1 AND 100),
    detail          TEXT,
    snapshot        JSONB       NOT NULL,
    flagged_by      TEXT        NOT NULL,
    flagged_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at     TIMESTAMPTZ,
    resolved_by     TEXT,
    resolution_note TEXT,
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL))
);

-- At most one open review per key and reason, so flagging is idempotent
-- (INSERT ... ON CONFLICT DO NOTHING) across retries and replicas.
CREATE UNIQUE INDEX IF NOT EXISTS idempotency_key_reviews_open_key_reason
    ON idempotency_key_reviews (key_id, reason) WHERE resolved_at IS NULL;

CREATE INDEX IF NOT EXISTS idempotency_key_reviews_open_flagged_at
    ON idempotency_key_reviews (flagged_at) WHERE resolved_at IS NULL;

-- +goose Down
DROP TABLE IF EXISTS idempotency_key_reviews;

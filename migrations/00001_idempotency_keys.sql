-- Schema contract of DESIGN.md: the article's idempotency_keys table, made
-- additive so an API written against the article's schema keeps working.
-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_keys (
    id              BIGSERIAL   PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key TEXT        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    last_run_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_at       TIMESTAMPTZ DEFAULT now(),
    request_method  TEXT        NOT NULL CHECK (char_length(request_method) <= 10),
    request_params  JSONB       NOT NULL,
    request_path    TEXT        NOT NULL CHECK (char_length(request_path) <= 100),
    -- TEXT, not the article's JSONB: a replay must return the stored body byte
    -- for byte, and JSONB normalises whitespace and key order. On a database
    -- that already has the article's JSONB column the column is left alone.
    response_code   INT         NULL,
    response_body   TEXT        NULL,
    recovery_point  TEXT        NOT NULL CHECK (char_length(recovery_point) <= 50),
    user_id         BIGINT      NOT NULL
);

-- Every added column is nullable or has a constant default, so ADD COLUMN on a
-- large existing table is a catalogue change, not a table rewrite.
ALTER TABLE idempotency_keys
    ADD COLUMN IF NOT EXISTS request_fingerprint       TEXT,
    -- The key this request uses with upstream services (Stripe's
    -- Idempotency-Key). Random, stored once, so every retry reuses it.
    ADD COLUMN IF NOT EXISTS upstream_idempotency_key  UUID,
    -- Completer bookkeeping.
    ADD COLUMN IF NOT EXISTS completer_attempts        INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS completer_next_attempt_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS completer_leased_until    TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS completer_last_error      TEXT,
    ADD COLUMN IF NOT EXISTS completer_gave_up_at      TIMESTAMPTZ;

-- +goose Down
ALTER TABLE idempotency_keys
    DROP COLUMN IF EXISTS completer_gave_up_at,
    DROP COLUMN IF EXISTS completer_last_error,
    DROP COLUMN IF EXISTS completer_leased_until,
    DROP COLUMN IF EXISTS completer_next_attempt_at,
    DROP COLUMN IF EXISTS completer_attempts,
    DROP COLUMN IF EXISTS upstream_idempotency_key,
    DROP COLUMN IF EXISTS request_fingerprint;

-- Rocket Rides' own tables, as in the article, applied by api.Migrate after
-- idemd's migrations. Additive and idempotent (IF NOT EXISTS).

CREATE TABLE IF NOT EXISTS users (
    id                 BIGSERIAL PRIMARY KEY,
    email              TEXT      NOT NULL UNIQUE CHECK (char_length(email) <= 255),
    -- Stripe customer with an active card.
    stripe_customer_id TEXT      NOT NULL UNIQUE CHECK (char_length(stripe_customer_id) <= 50),
    -- SHA-256 of the user's API key (Authorization: Bearer <key>): the key
    -- itself is never stored.
    api_key_sha256     TEXT      NOT NULL UNIQUE
);

-- No foreign key from idempotency_keys.user_id to users: idempotency_keys
-- belongs to idemd's schema contract, which other APIs share.

CREATE TABLE IF NOT EXISTS audit_records (
    id            BIGSERIAL   PRIMARY KEY,
    action        TEXT        NOT NULL CHECK (char_length(action) <= 50),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    data          JSONB       NOT NULL,
    origin_ip     CIDR        NOT NULL,
    resource_id   BIGINT      NOT NULL,
    resource_type TEXT        NOT NULL CHECK (char_length(resource_type) <= 50),
    user_id       BIGINT      NOT NULL REFERENCES users ON DELETE RESTRICT
);

CREATE TABLE IF NOT EXISTS rides (
    id                 BIGSERIAL       PRIMARY KEY,
    created_at         TIMESTAMPTZ     NOT NULL DEFAULT now(),
    -- Finds the ride when a request is recovered. Keys are reaped, so the
    -- reference is cleared rather than blocking the delete.
    idempotency_key_id BIGINT          UNIQUE REFERENCES idempotency_keys ON DELETE SET NULL,
    origin_lat         NUMERIC(13, 10) NOT NULL,
    origin_lon         NUMERIC(13, 10) NOT NULL,
    target_lat         NUMERIC(13, 10) NOT NULL,
    target_lon         NUMERIC(13, 10) NOT NULL,
    -- Stripe charge id (ch_...); NULL until charged.
    stripe_charge_id   TEXT            UNIQUE CHECK (char_length(stripe_charge_id) <= 50),
    user_id            BIGINT          NOT NULL REFERENCES users ON DELETE RESTRICT
);

-- The receipts worker's mailbox (package receipts).
CREATE TABLE IF NOT EXISTS ride_receipts (
    id           BIGSERIAL   PRIMARY KEY,
    river_job_id BIGINT      NOT NULL UNIQUE,
    ride_id      BIGINT,
    user_id      BIGINT      NOT NULL,
    email        TEXT        NOT NULL,
    amount       BIGINT      NOT NULL,
    currency     TEXT        NOT NULL,
    sent_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ride_receipts_ride_id ON ride_receipts (ride_id);

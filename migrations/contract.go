package migrations

import "strings"

// APIUpdatedColumns are the idempotency_keys columns an API changes while it
// serves a request, after inserting the key: each atomic phase sets
// recovery_point (and the article's phases locked_at and last_run_at), the
// last one stores response_code and response_body and clears locked_at, and
// package idem fills request_fingerprint and upstream_idempotency_key the
// first time it locks a key written without them.
//
// Schema contract: no index idemd creates on idempotency_keys may depend on
// any of these columns, as a key column, an INCLUDE column, inside an index
// expression or in a partial-index predicate. PostgreSQL can do an UPDATE
// as a HOT update (no new index entries, the old version pruned in place)
// only when no indexed column changes, so one such index makes every phase
// write into every index of the table, the primary key and the
// (user_id, idempotency_key) index the phases read included, and makes the
// API's SERIALIZABLE phases conflict far more often. The catalog test in
// internal/migrate (TestNoIndexOnAPIUpdatedColumns) enforces it; docs/completer.md
// and docs/api-authors.md state it for API authors.
const APIUpdatedColumns = "recovery_point locked_at last_run_at response_code response_body request_fingerprint upstream_idempotency_key"

// APIUpdatedColumnList is APIUpdatedColumns as a list.
func APIUpdatedColumnList() []string { return strings.Fields(APIUpdatedColumns) }

// ArticleSchema is the article's idempotency_keys (with its users table and
// its unique (user_id, idempotency_key) index) as an API written against
// the article has it before `idemctl migrate`: the schema idemd's
// migrations must stay additive on, and the anchor the HOT benchmark and
// the schema-contract tests compare idemd's schema with.
const ArticleSchema = `
CREATE TABLE users (id BIGSERIAL PRIMARY KEY, email TEXT NOT NULL);
CREATE TABLE idempotency_keys (
    id              BIGSERIAL   PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key TEXT        NOT NULL CHECK (char_length(idempotency_key) <= 100),
    last_run_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_at       TIMESTAMPTZ DEFAULT now(),
    request_method  TEXT        NOT NULL CHECK (char_length(request_method) <= 10),
    request_params  JSONB       NOT NULL,
    request_path    TEXT        NOT NULL CHECK (char_length(request_path) <= 100),
    response_code   INT         NULL,
    response_body   JSONB       NULL,
    recovery_point  TEXT        NOT NULL CHECK (char_length(recovery_point) <= 50),
    user_id         BIGINT      NOT NULL REFERENCES users ON DELETE RESTRICT
);
CREATE UNIQUE INDEX idempotency_keys_user_id_idempotency_key ON idempotency_keys (user_id, idempotency_key);
`

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

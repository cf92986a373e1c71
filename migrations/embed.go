// Package migrations holds idemd's SQL migrations (the schema contract of
// docs/design.md), embedded so every binary carries the schema it expects.
package migrations

import "embed"

// FS holds the goose-formatted SQL files, applied in file-name order.
//
//go:embed *.sql
var FS embed.FS

package completer

import (
	"testing"

	"github.com/idemd/idemd/internal/testing/sqltext"
)

// composed are the statements built from parts (sql.go) that a reviewer
// reads whole in testdata/, and internal/bench/completer times as they are
// written there.
var composed = map[string]string{
	"candidate.sql":         candidateSQL,
	"candidate_locking.sql": candidateLocking,
	"claim.sql":             claimSQL,
}

// TestComposedSQLIsReviewable: each composed statement is in
// testdata/<name>.sql as the completer runs it, so a change to a part
// shows in review as the whole statement it changes, and the benchmark
// reads the very text (go test ./internal/completer -run
// TestComposedSQLIsReviewable -update rewrites the files).
func TestComposedSQLIsReviewable(t *testing.T) {
	sqltext.Check(t, "completer", composed)
}

package riverdb

import (
	"testing"

	"github.com/idemd/idemd/internal/testing/sqltext"
)

// composed are the statements built from parts (move.go) that a
// reviewer reads whole in testdata/.
var composed = map[string]string{
	"move.sql": MoveSQL,
}

// TestComposedSQLIsReviewable: each composed statement is in
// testdata/<name>.sql as the enqueuer runs it, so a change to a part (say
// ValidSQL) shows in review as the whole statement it changes (go test
// ./internal/riverdb -run TestComposedSQLIsReviewable -update rewrites
// the files).
func TestComposedSQLIsReviewable(t *testing.T) {
	sqltext.Check(t, "riverdb", composed)
}

package enqueuer

import (
	"testing"

	"github.com/idemd/idemd/internal/testing/sqltext"
)

// composed are the statements built from parts (servermove.go) that a
// reviewer reads whole in testdata/.
var composed = map[string]string{
	"move.sql": moveSQL,
}

// TestComposedSQLIsReviewable: each composed statement is in
// testdata/<name>.sql as the enqueuer runs it, so a change to a part (say
// validSQL) shows in review as the whole statement it changes (go test
// ./internal/enqueuer -run TestComposedSQLIsReviewable -update rewrites
// the files).
func TestComposedSQLIsReviewable(t *testing.T) {
	sqltext.Check(t, "enqueuer", composed)
}

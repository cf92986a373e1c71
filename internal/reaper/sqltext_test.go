package reaper

import (
	"testing"

	"github.com/idemd/idemd/internal/testing/sqltext"
)

// composed are the statements built from parts (sql.go) that a reviewer
// reads whole in testdata/: the three batch forms and the round's bounds.
var composed = map[string]string{
	"batch_range.sql":   rangeBatchSQL,
	"batch_ordered.sql": orderedBatchSQL,
	"batch_locking.sql": lockingBatchSQL,
	"round_bounds.sql":  roundBoundsSQL,
}

// TestComposedSQLIsReviewable: each composed statement is in
// testdata/<name>.sql as the reaper runs it, so a change to a part (say
// eligible or reviewTail) shows in review as every whole statement it
// changes (go test ./internal/reaper -run TestComposedSQLIsReviewable
// -update rewrites the files).
func TestComposedSQLIsReviewable(t *testing.T) {
	sqltext.Check(t, "reaper", composed)
}

package reaper

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sql from the composed statements")

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
	for name, sql := range composed {
		path := filepath.Join("testdata", name)
		want := strings.TrimSpace(sql) + "\n"
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test ./internal/reaper -run TestComposedSQLIsReviewable -update writes it)", err)
		}
		if string(got) != want {
			t.Errorf("%s is not the statement the reaper composes; rerun with -update and review the diff:\n%s", path, want)
		}
	}
}

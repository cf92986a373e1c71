package completer

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sql from the composed statements")

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
			t.Fatalf("%v (go test ./internal/completer -run TestComposedSQLIsReviewable -update writes it)", err)
		}
		if string(got) != want {
			t.Errorf("%s is not the statement the completer composes; rerun with -update and review the diff:\n%s", path, want)
		}
	}
}

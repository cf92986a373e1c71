package enqueuer

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sql from the composed statements")

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
			t.Fatalf("%v (go test ./internal/enqueuer -run TestComposedSQLIsReviewable -update writes it)", err)
		}
		if string(got) != want {
			t.Errorf("%s is not the statement the enqueuer composes; rerun with -update and review the diff:\n%s", path, want)
		}
	}
}

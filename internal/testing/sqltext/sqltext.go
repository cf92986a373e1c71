// Package sqltext keeps composed SQL statements reviewable as text: each
// statement built from parts is held in testdata/<name> as the code runs
// it, so a change to a part shows in review as every whole statement it
// changes. One test per package calls Check; `go test <pkg> -run
// TestComposedSQLIsReviewable -update` rewrites the files.
package sqltext

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sql from the composed statements")

// Check compares each statement with testdata/<name> (or, with -update,
// writes it there). who names the component in the failure message.
func Check(t *testing.T, who string, statements map[string]string) {
	t.Helper()
	for name, sql := range statements {
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
			t.Fatalf("%v (go test -run TestComposedSQLIsReviewable -update writes it)", err)
		}
		if string(got) != want {
			t.Errorf("%s is not the statement the %s composes; rerun with -update and review the diff:\n%s", path, who, want)
		}
	}
}

package completerbench

import (
	"strings"
	"testing"
)

// TestCandidateSQLIsTheCompletersFile: the benchmark reads the completer's
// composed candidate query and its locking from the completer's testdata,
// where TestComposedSQLIsReviewable keeps them equal to what it runs.
func TestCandidateSQLIsTheCompletersFile(t *testing.T) {
	sel, lock, err := candidateSQL()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sel, "FROM idemd_unfinished_keys u") || !strings.Contains(sel, "LIMIT @batch_size") {
		t.Errorf("the candidate query read is not the completer's:\n%s", sel)
	}
	if strings.TrimSpace(lock) != "FOR UPDATE OF c SKIP LOCKED" {
		t.Errorf("the locking read: %q", lock)
	}
}

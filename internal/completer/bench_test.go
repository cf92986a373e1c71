package completer_test

import (
	"strings"
	"testing"

	completerbench "github.com/idemd/idemd/internal/bench/completer"
	"github.com/idemd/idemd/internal/completer"
)

// The benchmark times its own copy of the candidate query (nothing is
// exported from the completer for it): the copy must be the query the
// completer runs, up to white space.
func TestBenchTimesTheCandidateQuery(t *testing.T) {
	same := func(a, b string) bool {
		return strings.Join(strings.Fields(a), " ") == strings.Join(strings.Fields(b), " ")
	}
	if !same(completerbench.CandidateSQL, completer.CandidateSQLForTest) {
		t.Errorf("internal/bench/completer's CandidateSQL is not the completer's candidate query:\n%s\nwant\n%s", completerbench.CandidateSQL, completer.CandidateSQLForTest)
	}
	if !same(completerbench.CandidateLocking, completer.CandidateLockingForTest) {
		t.Errorf("internal/bench/completer's CandidateLocking %q, the completer's %q", completerbench.CandidateLocking, completer.CandidateLockingForTest)
	}
}

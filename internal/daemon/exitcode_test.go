package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemd/idemd/internal/config"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{&config.Error{Problems: []string{"--x"}}, ExitConfig},
		{fmt.Errorf("run: %w", &config.Error{Problems: []string{"--x"}}), ExitConfig},
		{errors.New("database down"), ExitRuntime},
		{fmt.Errorf("keys retry: %w", refusal("no key 5")), ExitRefused},
		{errors.Join(refusal("no key 5"), fmt.Errorf("key 6: %w", refusal("finished"))), ExitRefused},
		// One failure that is not a refusal: running it again may help.
		{errors.Join(errors.New("database down"), refusal("no key 5")), ExitRuntime},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// refusal is a Refusal, as the operator core's errors are.
type refusal string

func (r refusal) Error() string { return string(r) }
func (refusal) Refusal()        {}

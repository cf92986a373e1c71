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
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

package enqueuer

import (
	"io"
	"testing"

	"github.com/idemd/idemd/internal/config"
)

// Which command lines keep the enqueuer running (and serving :9090) and which
// do one piece of work and exit.
func TestLongRunning(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--once"}, false},
	} {
		var cmd Command
		args := tc.args
		if _, err := config.Parse("enqueuer", "", &cmd, args, io.Discard); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := cmd.LongRunning(); got != tc.want {
			t.Errorf("%v: LongRunning = %v, want %v", tc.args, got, tc.want)
		}
	}
}

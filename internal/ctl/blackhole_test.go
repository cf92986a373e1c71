package ctl_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// idemctl's commands on a database that does not answer (a network gone
// silent) fail within --database-timeout, exit 1 (retryable) and say
// which command the database did not answer, instead of hanging a
// terminal or a script; once the network forwards, they work.
func TestCommandsEndInABlackHole(t *testing.T) {
	hole, holeURL := blackhole.Through(t, dbtest.NewDatabase(t))
	hole.BlackHole(tcpproxy.HoleOptions{})
	for _, args := range [][]string{{"status"}, {"review", "list"}, {"reaper", "runs"}} {
		var code int
		var stderr string
		testwait.Returns(t, time.Minute, "idemctl "+strings.Join(args, " "), func() {
			code, _, stderr = run(t, append([]string{"--database-url", holeURL, "--database-timeout", "300ms"}, args...)...)
		})
		want := "database did not answer within 300ms: idemctl " + strings.Join(args, " ")
		if code != daemon.ExitRuntime || !strings.Contains(stderr, want) {
			t.Fatalf("idemctl %s in a black hole: exit %d, stderr %q; want exit 1 saying %q", strings.Join(args, " "), code, stderr, want)
		}
	}
	hole.Heal()
	if code, _, stderr := run(t, "--database-url", holeURL, "--database-timeout", "5s", "status"); code != 0 {
		t.Fatalf("idemctl status after the black hole: exit %d: %s", code, stderr)
	}
}

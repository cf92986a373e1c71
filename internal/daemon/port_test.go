package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/testbin"
)

// holdDefaultOpsPort makes sure something holds :9090 for the test, as a
// running daemon would.
func holdDefaultOpsPort(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", ":9090")
	if err != nil {
		// Already held by another process: just as good.
		if c, derr := net.DialTimeout("tcp", "127.0.0.1:9090", time.Second); derr == nil {
			c.Close()
			return
		}
		t.Fatalf("cannot hold :9090: %v", err)
	}
	t.Cleanup(func() { l.Close() })
}

// run runs bin with args and returns its exit code and stderr.
func run(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	default:
		t.Fatalf("%s: %v", bin, err)
		return -1, ""
	}
}

// One-shot runs serve no HTTP unless asked, so an operator can run them
// next to a daemon that holds :9090 (README, "Running the daemons"); a
// long-running daemon still takes the default :9090, and says when it
// cannot.
func TestOneShotRunsServeNoHTTP(t *testing.T) {
	holdDefaultOpsPort(t)
	dbURL := dbtest.NewDatabase(t)
	enqueuer := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	reaper := testbin.Build(t, "github.com/idemd/idemd/cmd/reaper")
	for _, tc := range []struct {
		name string
		bin  string
		args []string
	}{
		{"enqueuer --once", enqueuer, []string{"--once"}},
		{"reaper --dry-run", reaper, []string{"--dry-run"}},
		{"reaper", reaper, nil},
	} {
		if code, stderr := run(t, tc.bin, append(tc.args, "--database-url", dbURL)...); code != daemon.ExitOK {
			t.Errorf("%s next to a held :9090: exit %d\n%s", tc.name, code, stderr)
		}
	}
	code, stderr := run(t, enqueuer, "--database-url", dbURL)
	if code != daemon.ExitRuntime || !strings.Contains(stderr, "ops server failed to start") {
		t.Errorf("long-running enqueuer with :9090 held: exit %d, want %d naming the ops server\n%s", code, daemon.ExitRuntime, stderr)
	}
}

// A daemon run on a database nobody migrated says to run `idemctl migrate`,
// once, instead of PostgreSQL's relation "staged_jobs" does not exist.
func TestMissingSchemaSaysMigrate(t *testing.T) {
	ctx := context.Background()
	dbURL, drop, err := scratchdb.Create(ctx, dbtest.ServerURL(t), "idemd_noschema")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop(context.Background()) })
	code, stderr := run(t, testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer"), "--once", "--log-format=json", "--database-url", dbURL)
	if code != daemon.ExitRuntime {
		t.Fatalf("exit %d, want %d\n%s", code, daemon.ExitRuntime, stderr)
	}
	var errorLines []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, `"level":"error"`) {
			errorLines = append(errorLines, line)
		}
	}
	if len(errorLines) != 1 || !strings.Contains(errorLines[0], "run `idemctl migrate`") {
		t.Errorf("%d error lines, want one saying run `idemctl migrate`:\n%s", len(errorLines), stderr)
	}
}

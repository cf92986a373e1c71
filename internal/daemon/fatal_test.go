package daemon_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
)

// dbtest.Main removes the binaries testbin built.
func TestMain(m *testing.M) { dbtest.Main(m) }

// A command that fails logs exactly one error line, without a stack trace:
// the commands whose own line already carries the error (the enqueuer's
// drain result, the reaper's run summary) mark it logged, and MainWith logs
// the others ("failed"). Real binaries, so the logger is the one operators
// get; the database is a closed port, so each fails at once.
func TestFatalErrorIsOneLine(t *testing.T) {
	url := "postgres://idemd@" + closedAddr(t) + "/idemd?connect_timeout=5"
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw=="), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pkg  string
		args []string
	}{
		{"enqueuer --once", "github.com/idemd/idemd/cmd/enqueuer", []string{"--once"}},
		{"reaper --once", "github.com/idemd/idemd/cmd/reaper", []string{"--once"}},
		// Logs no error of its own: MainWith's "failed" is the one line.
		{"completer --once", "github.com/idemd/idemd/cmd/completer", []string{"--once", "--api-url", "http://127.0.0.1:1",
			"--auth-secret-file", secret, "--auth-secret-file-previous", secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := testbin.Build(t, tc.pkg)
			cmd := exec.Command(bin, append(tc.args, "--http-addr=", "--log-format=json", "--database-url", url)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != daemon.ExitRuntime {
				t.Fatalf("exit: %v, want code %d\n%s", err, daemon.ExitRuntime, stderr.String())
			}
			var errorLines []string
			for _, line := range strings.Split(stderr.String(), "\n") {
				if strings.Contains(line, `"level":"error"`) {
					errorLines = append(errorLines, line)
				}
				if strings.Contains(line, `"stacktrace"`) {
					t.Errorf("log line with a stack trace: %s", line)
				}
			}
			if len(errorLines) != 1 || !strings.Contains(errorLines[0], "connect") {
				t.Errorf("%d error lines, want one naming the connection failure:\n%s", len(errorLines), stderr.String())
			}
		})
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

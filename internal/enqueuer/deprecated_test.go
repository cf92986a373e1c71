package enqueuer

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
)

// The spellings of before the rename still set the settings they named,
// from the command line and from their old environment variables, and each
// one used yields one warning naming its replacement; the new names alone
// yield none, and --help shows only the new names.
func TestDeprecatedIntervalSpellings(t *testing.T) {
	for _, env := range []string{"IDEMD_POLL_INTERVAL", "IDEMD_POLLING_INTERVAL", "IDEMD_SWEEP_INTERVAL", "IDEMD_BUSY_POLL_INTERVAL"} {
		t.Setenv(env, "") // registers the restore; unset below
		if err := os.Unsetenv(env); err != nil {
			t.Fatal(err)
		}
	}
	def := DefaultSettings()
	cases := []struct {
		name        string
		args        []string
		env         map[string]string
		sweep, busy time.Duration
		warnings    int // lines
		warn        []string
	}{
		{"new names", []string{"--sweep-interval=7s", "--busy-poll-interval=9ms"}, nil, 7 * time.Second, 9 * time.Millisecond, 0, nil},
		{"defaults", nil, nil, def.SweepInterval, def.BusyPollInterval, 0, nil},
		{"old flags", []string{"--poll-interval=7s", "--polling-interval=0s"}, nil, 7 * time.Second, 0, 2,
			[]string{"--poll-interval (IDEMD_POLL_INTERVAL) is deprecated", "use --sweep-interval (IDEMD_SWEEP_INTERVAL)",
				"--polling-interval (IDEMD_POLLING_INTERVAL) is deprecated", "use --busy-poll-interval (IDEMD_BUSY_POLL_INTERVAL)"}},
		{"old env", nil, map[string]string{"IDEMD_POLL_INTERVAL": "11s", "IDEMD_POLLING_INTERVAL": "4ms"}, 11 * time.Second, 4 * time.Millisecond, 2,
			[]string{"--poll-interval (IDEMD_POLL_INTERVAL) is deprecated", "--polling-interval (IDEMD_POLLING_INTERVAL) is deprecated"}},
		{"new env", nil, map[string]string{"IDEMD_SWEEP_INTERVAL": "11s", "IDEMD_BUSY_POLL_INTERVAL": "4ms"}, 11 * time.Second, 4 * time.Millisecond, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var cmd Command
			args := append([]string{"--database-url=postgres://x@127.0.0.1/x"}, c.args...)
			if _, err := config.Parse("enqueuer", Description, &cmd, args, io.Discard); err != nil {
				t.Fatalf("parse %v: %v", args, err)
			}
			s := cmd.settings()
			if s.SweepInterval != c.sweep || s.BusyPollInterval != c.busy {
				t.Errorf("sweep %s, busy poll %s; want %s, %s", s.SweepInterval, s.BusyPollInterval, c.sweep, c.busy)
			}
			warnings := strings.Join(cmd.deprecationWarnings(), "\n")
			if len(cmd.deprecationWarnings()) != c.warnings {
				t.Errorf("warnings:\n%s\nwant %q", warnings, c.warn)
			}
			for _, w := range c.warn {
				if !strings.Contains(warnings, w) {
					t.Errorf("warnings lack %q:\n%s", w, warnings)
				}
			}
		})
	}

	var help strings.Builder
	var cmd Command
	if _, err := config.Parse("enqueuer", Description, &cmd, []string{"--help"}, &help); !errors.Is(err, config.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range []string{"--poll-interval", "--polling-interval"} {
		if strings.Contains(help.String(), name) {
			t.Errorf("--help shows the deprecated %s:\n%s", name, help.String())
		}
	}
	for _, name := range []string{"--sweep-interval", "--busy-poll-interval"} {
		if !strings.Contains(help.String(), name) {
			t.Errorf("--help lacks %s:\n%s", name, help.String())
		}
	}
}

// The binary logs the deprecation warning and runs; a bad value under an
// old spelling is refused under the name typed.
func TestDeprecatedIntervalSpellingsInTheBinary(t *testing.T) {
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	cmd := exec.Command(bin, "--http-addr=", "--once", "--log-format=console", "--poll-interval=0s")
	cmd.Env = append(cleanEnv(), "DATABASE_URL=postgres://x@127.0.0.1/x")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 || !strings.Contains(string(out), "--poll-interval must be positive") {
		t.Errorf("--poll-interval=0s: %v, want exit 2 naming --poll-interval\n%s", err, out)
	}

	cmd = exec.Command(bin, "--http-addr=", "--once", "--log-format=console", "--poll-interval=1s")
	cmd.Env = append(cleanEnv(), "DATABASE_URL="+dbtest.NewDatabase(t), "IDEMD_POLLING_INTERVAL=0s")
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--once with deprecated spellings: %v\n%s", err, out)
	}
	for _, w := range []string{"--poll-interval (IDEMD_POLL_INTERVAL) is deprecated", "--polling-interval (IDEMD_POLLING_INTERVAL) is deprecated"} {
		if strings.Count(string(out), w) != 1 {
			t.Errorf("output has %q %d times, want once:\n%s", w, strings.Count(string(out), w), out)
		}
	}
}

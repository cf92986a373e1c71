package daemon_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/testing/testbin"
)

// TestUnknownEnvWarnsOnce: each daemon and idemctl, real binaries, with a
// mistyped IDEMD_ variable in the environment tell it once at start, naming
// it and the variable meant (a daemon in its log, idemctl on stderr), and
// say nothing of the environment when every IDEMD_ variable is a setting.
// The database is a closed port: the warning comes before any connection.
func TestUnknownEnvWarnsOnce(t *testing.T) {
	url := "postgres://idemd@" + closedAddr(t) + "/idemd?connect_timeout=5"
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw=="), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		pkg           string
		args          []string
		typo, meant   string // a variable mistyped, and the one meant
		correct       string // a setting of the command, set right
		warningMarker string // what marks a warning about the environment
	}{
		{"enqueuer", "github.com/idemd/idemd/cmd/enqueuer", []string{"--once", "--http-addr="},
			"IDEMD_BACTH_SIZE", "IDEMD_BATCH_SIZE", "IDEMD_BATCH_SIZE", `"variable":`},
		{"completer", "github.com/idemd/idemd/cmd/completer", []string{"--once", "--http-addr=", "--api-url", "http://127.0.0.1:1",
			"--auth-secret-file", secret}, "IDEMD_RATEE", "IDEMD_RATE", "IDEMD_RATE", `"variable":`},
		{"reaper", "github.com/idemd/idemd/cmd/reaper", []string{"--once", "--http-addr="},
			"IDEMD_RETENTON", "IDEMD_RETENTION", "IDEMD_RETENTION", `"variable":`},
		// IDEMD_LOCK_WAIT is migrate's: a setting of idemctl for status too.
		{"idemctl", "github.com/idemd/idemd/cmd/idemctl", []string{"status"},
			"IDEMD_LOCK_WAITT", "IDEMD_LOCK_WAIT", "IDEMD_LOCK_WAIT", "idemctl: warning:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := testbin.Build(t, tc.pkg)
			values := map[string]string{"IDEMD_BATCH_SIZE": "100", "IDEMD_RATE": "5", "IDEMD_RETENTION": "72h", "IDEMD_LOCK_WAIT": "1m"}
			run := func(env ...string) string {
				t.Helper()
				cmd := exec.Command(bin, append(tc.args, "--log-format=json", "--database-url", url)...)
				cmd.Env = append(environWithoutIdemd(), env...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				_ = cmd.Run() // fails on the closed port; the warning came first
				return stderr.String()
			}
			var warnings []string
			out := run(tc.typo+"="+values[tc.meant], "IDEMD_LOG_LEVEL=info")
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, tc.warningMarker) {
					warnings = append(warnings, line)
				}
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tc.typo) || !strings.Contains(warnings[0], tc.meant) {
				t.Errorf("%s set: %d warnings, want one naming it and %s:\n%s", tc.typo, len(warnings), tc.meant, out)
			}
			out = run(tc.correct+"="+values[tc.correct], "IDEMD_LOG_LEVEL=info")
			if strings.Contains(out, tc.warningMarker) || strings.Contains(out, "did you mean") {
				t.Errorf("a correct environment gave a warning:\n%s", out)
			}
		})
	}
}

// environWithoutIdemd is the test's environment without its IDEMD_
// variables (a soak run's among them), which would be the binaries'.
func environWithoutIdemd() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMD_") {
			env = append(env, kv)
		}
	}
	return env
}

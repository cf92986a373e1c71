package ctl_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestBareIdemctlPrintsHelp: idemctl with no arguments is a question; it
// answers with the help, exit 0, and no error.
func TestBareIdemctlPrintsHelp(t *testing.T) {
	code, out, errs := run(t)
	if code != 0 || errs != "" {
		t.Fatalf("bare idemctl: exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"Usage: idemctl <command>", "migrate", "status", "Examples:"} {
		if !strings.Contains(out, want) {
			t.Errorf("bare idemctl's output lacks %q:\n%s", want, out)
		}
	}
	if code, out2, _ := run(t, "--help"); code != 0 || out2 != out {
		t.Errorf("bare idemctl and idemctl --help differ (exit %d)", code)
	}
}

var commandLine = regexp.MustCompile(`(?m)^  ([a-z]+(?: [a-z]+)?)\s{2,}`)

// commands lists idemctl's commands from its own help.
func commands(t *testing.T) [][]string {
	t.Helper()
	_, out, _ := run(t, "--help")
	_, list, ok := strings.Cut(out, "\nCommands:\n")
	if !ok {
		t.Fatalf("no Commands section:\n%s", out)
	}
	var cmds [][]string
	for _, m := range commandLine.FindAllStringSubmatch(list, -1) {
		cmds = append(cmds, strings.Fields(m[1]))
	}
	if len(cmds) < 10 {
		t.Fatalf("found %d commands in the help:\n%s", len(cmds), out)
	}
	return cmds
}

// TestEveryCommandHelpHasExamples: each command's --help ends with
// examples that run that very command.
func TestEveryCommandHelpHasExamples(t *testing.T) {
	for _, cmd := range commands(t) {
		code, out, _ := run(t, append(slices.Clone(cmd), "--help")...)
		if code != 0 {
			t.Errorf("%v --help: exit %d", cmd, code)
			continue
		}
		_, ex, ok := strings.Cut(out, "Examples:")
		if !ok || !strings.Contains(ex, "idemctl "+strings.Join(cmd, " ")) {
			t.Errorf("%v --help has no example of itself:\n%s", cmd, out)
		}
	}
}

// readCommands are the commands that print a report, with the arguments
// each needs; every one takes the same -o text|json.
var readCommands = [][]string{
	{"status"},
	{"review", "list"},
	{"keys", "show", "--user-id", "9", "--key", "k-output"},
	{"dead", "list"},
	{"dead", "show", "301"},
	{"reaper", "runs"},
}

// TestOneOutputFlag: every command with an output flag has exactly -o /
// --output text|json (no second spelling in its help), every read command
// prints JSON with -o json and --output json, and the deprecated --format
// still works, hidden, with a warning naming -o.
func TestOneOutputFlag(t *testing.T) {
	readCommands := append(slices.Clone(readCommands), conformanceArgs(t))
	withOutput := 0
	for _, cmd := range commands(t) {
		_, out, _ := run(t, append(slices.Clone(cmd), "--help")...)
		if strings.Contains(out, "--format") {
			t.Errorf("%v --help still shows --format:\n%s", cmd, out)
		}
		if !strings.Contains(out, "--output") {
			continue
		}
		withOutput++
		if !strings.Contains(out, `-o, --output="text"`) {
			t.Errorf("%v: its output flag is not -o/--output defaulting to text:\n%s", cmd, out)
		}
		if !slices.ContainsFunc(readCommands, func(rc []string) bool { return len(rc) >= len(cmd) && slices.Equal(rc[:len(cmd)], cmd) }) {
			t.Errorf("%v takes -o but is not in readCommands: test it here", cmd)
		}
	}
	if withOutput != len(readCommands) {
		t.Errorf("%d commands take -o, readCommands lists %d", withOutput, len(readCommands))
	}

	url, pool := setup(t)
	addKey(t, pool, "k-output", "started", "1 hour")
	addDead(t, pool, 301, "send_receipt", "unknown_kind: send_receipt is not registered", "1 hour")
	flag(t, pool, addKey(t, pool, "k-output-review", "started", "2 hours"), review.ReasonCompleterGaveUp, "1 hour")
	db := []string{"--database-url", url}
	for _, cmd := range readCommands {
		for _, o := range [][]string{{"-o", "json"}, {"--output", "json"}, {"--output=json"}, {"--format", "json"}} {
			code, out, errs := run(t, append(append(slices.Clone(db), cmd...), o...)...)
			if code != 0 || !json.Valid([]byte(out)) {
				t.Errorf("%v %v: exit %d, not JSON:\n%s%s", cmd, o, code, out, errs)
			}
			deprecated := strings.Contains(errs, "--format is deprecated") && strings.Contains(errs, "-o/--output")
			if deprecated != (o[0] == "--format") {
				t.Errorf("%v %v: deprecation warning %v, stderr %q", cmd, o, deprecated, errs)
			}
		}
		for _, o := range [][]string{nil, {"-o", "text"}, {"--format", "table"}} {
			code, out, errs := run(t, append(append(slices.Clone(db), cmd...), o...)...)
			if code != 0 || out == "" || json.Valid([]byte(out)) {
				t.Errorf("%v %v: exit %d, want text:\n%s%s", cmd, o, code, out, errs)
			}
		}
		if code, _, errs := run(t, append(append(slices.Clone(db), cmd...), "-o", "yaml")...); code != 2 || !strings.Contains(errs, "yaml") {
			t.Errorf("%v -o yaml: exit %d, %s", cmd, code, errs)
		}
	}
}

// TestMigrateLockWait: migrate's wait for a concurrent run is --lock-wait
// (IDEMD_LOCK_WAIT). IDEMD_LOCK_TIMEOUT is the completer's (a key's lock
// age), which migrate does not read; migrate still accepts --lock-timeout
// on the command line, hidden, with a warning, so scripts keep working.
func TestMigrateLockWait(t *testing.T) {
	_, help, _ := run(t, "migrate", "--help")
	if !strings.Contains(help, "--lock-wait=5m") || !strings.Contains(help, "$IDEMD_LOCK_WAIT") {
		t.Errorf("migrate --help lacks --lock-wait ($IDEMD_LOCK_WAIT):\n%s", help)
	}
	if regexp.MustCompile(`\$IDEMD_LOCK_TIMEOUT\b|\s--lock-timeout\b`).MatchString(help) {
		t.Errorf("migrate --help still shows the lock timeout:\n%s", help)
	}
	// A value the old name would have applied and that does not parse as a
	// duration: migrate must not read the completer's variable at all.
	t.Setenv("IDEMD_LOCK_TIMEOUT", "not-a-duration")
	url, _ := setup(t)
	for _, args := range [][]string{
		{"migrate"},
		{"migrate", "--lock-wait", "1m"},
		{"migrate", "--lock-timeout", "1m"},
		{"migrate", "--lock-timeout=1m"},
	} {
		code, out, errs := run(t, append([]string{"--database-url", dbtest.MigratorURL(url)}, args...)...)
		if code != 0 || !strings.Contains(out, "migrate: applied") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errs)
		}
		deprecated := strings.Contains(errs, "--lock-timeout is deprecated") && strings.Contains(errs, "--lock-wait")
		old := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--lock-timeout") })
		if deprecated != old {
			t.Errorf("%v: deprecation warning %v, stderr %q", args, deprecated, errs)
		}
	}
	t.Setenv("IDEMD_LOCK_WAIT", "not-a-duration")
	if code, _, errs := run(t, "--database-url", dbtest.MigratorURL(url), "migrate"); code != 2 || !strings.Contains(errs, "IDEMD_LOCK_WAIT") {
		t.Errorf("IDEMD_LOCK_WAIT=not-a-duration: exit %d, %s", code, errs)
	}
}

// TestMigrateDDLLockTimeout: every migration statement's lock_timeout is
// --ddl-lock-timeout (IDEMD_DDL_LOCK_TIMEOUT), its own name, and it must be
// positive (zero would be PostgreSQL's "wait forever").
func TestMigrateDDLLockTimeout(t *testing.T) {
	_, help, _ := run(t, "migrate", "--help")
	if !strings.Contains(help, "--ddl-lock-timeout=2s") || !strings.Contains(help, "$IDEMD_DDL_LOCK_TIMEOUT") {
		t.Errorf("migrate --help lacks --ddl-lock-timeout ($IDEMD_DDL_LOCK_TIMEOUT):\n%s", help)
	}
	url, _ := setup(t)
	if code, out, errs := run(t, "--database-url", dbtest.MigratorURL(url), "migrate", "--ddl-lock-timeout", "0s"); code != 2 || !strings.Contains(errs, "--ddl-lock-timeout must be positive") {
		t.Errorf("--ddl-lock-timeout 0s: exit %d\n%s%s", code, out, errs)
	}
	t.Setenv("IDEMD_DDL_LOCK_TIMEOUT", "not-a-duration")
	if code, _, errs := run(t, "--database-url", dbtest.MigratorURL(url), "migrate"); code != 2 || !strings.Contains(errs, "IDEMD_DDL_LOCK_TIMEOUT") {
		t.Errorf("IDEMD_DDL_LOCK_TIMEOUT=not-a-duration: exit %d, %s", code, errs)
	}
	t.Setenv("IDEMD_DDL_LOCK_TIMEOUT", "500ms")
	if code, out, errs := run(t, "--database-url", dbtest.MigratorURL(url), "migrate"); code != 0 || !strings.Contains(out, "migrate: applied") {
		t.Errorf("IDEMD_DDL_LOCK_TIMEOUT=500ms: exit %d\n%s%s", code, out, errs)
	}
}

package ctl_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpAndVersionCommands: `help [COMMAND]` is `[COMMAND] --help` and
// `version` is `--version`, without a database.
func TestHelpAndVersionCommands(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, tc := range []struct{ cmd, same []string }{
		{[]string{"help"}, []string{"--help"}},
		{[]string{"help", "keys", "retry"}, []string{"keys", "retry", "--help"}},
		{[]string{"version"}, []string{"--version"}},
	} {
		code, out, errs := run(t, tc.cmd...)
		code2, out2, _ := run(t, tc.same...)
		if code != 0 || errs != "" || out == "" || code2 != 0 || out != out2 {
			t.Errorf("idemctl %s: exit %d, stderr %q; differs from idemctl %s (exit %d):\n%s\n---\n%s",
				strings.Join(tc.cmd, " "), code, errs, strings.Join(tc.same, " "), code2, out, out2)
		}
	}
	if _, out, _ := run(t, "version"); !strings.HasPrefix(out, "idemctl ") || !strings.Contains(out, "commit") {
		t.Errorf("version: %q", out)
	}
}

// TestUnknownCommandListsCommands: a mistyped command is named as typed,
// with the commands there are, once, exit 2.
func TestUnknownCommandListsCommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"bogus"}, []string{`unknown command "bogus" for "idemctl"`, "migrate, status, review, keys, dead"}},
		{[]string{"keys", "shwo"}, []string{`unknown command "shwo" for "idemctl keys"`, "show, retry"}},
		{[]string{"help", "bogus"}, []string{`unknown command "bogus" for "idemctl"`}},
	} {
		code, out, errs := run(t, append([]string{"--database-url", "postgres://127.0.0.1:1/x"}, tc.args...)...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d, want 2; stdout %q", tc.args, code, out)
		}
		for _, w := range tc.want {
			if strings.Count(errs, w) != 1 {
				t.Errorf("%v: stderr does not say %q once:\n%s", tc.args, w, errs)
			}
		}
	}
}

// TestErrorsNameArgumentsAsTyped: a positional argument is <id>, not a
// flag it has no spelling of, and a bad value is reported once (not again
// by the command's own check of the value it could not hold).
func TestErrorsNameArgumentsAsTyped(t *testing.T) {
	code, _, errs := run(t, "--database-url", "postgres://127.0.0.1:1/x", "review", "resolve", "abc", "--by", "alice", "--note", "x")
	if code != 2 || !strings.Contains(errs, `<id>: "abc" is not a whole number`) || strings.Contains(errs, "--id") || strings.Count(errs, "\n  - ") != 1 {
		t.Errorf("exit %d, want 2 and one problem naming <id>:\n%s", code, errs)
	}
	// A failure is printed once, without a prefix of another command.
	code, _, errs = run(t, "--database-url", "postgres://127.0.0.1:1/x", "status")
	if code != 1 || strings.Contains(errs, "migrate:") || strings.Count(errs, "status:") != 1 {
		t.Errorf("status on an unreachable database: exit %d, want 1 and an error naming status once:\n%s", code, errs)
	}
	lines := strings.Split(errs, "\n")
	for i := 1; i < len(lines); i++ {
		if lines[i] != "" && lines[i] == lines[i-1] {
			t.Errorf("a line printed twice: %q\n%s", lines[i], errs)
		}
	}
}

// TestHelpTellsRequiredFromOptional: conformance runs without a database,
// and its --help does not call --database-url required; a command that
// needs it still says so.
func TestHelpTellsRequiredFromOptional(t *testing.T) {
	_, out, _ := run(t, "conformance", "--help")
	out = strings.Join(strings.Fields(out), " ") // kong wraps the help
	if !strings.Contains(out, "but conformance (optional there)") {
		t.Errorf("conformance --help does not say --database-url is optional for it:\n%s", out)
	}
	if !strings.Contains(out, "Base URL of the running API (as the completer's --api-url). Required ($IDEMD_API_URL)") {
		t.Errorf("conformance --help does not call --api-url required:\n%s", out)
	}
}

// TestCompletion: the completion scripts are valid for their shell and
// __complete, which they call, answers from the command model without a
// database.
func TestCompletion(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"ke"}, "keys\n"},
		{[]string{"keys", ""}, "show\nretry\n"},
		{[]string{"keys", "retry", "--b"}, "--by\n"},
		{[]string{"--pooler", "none", "dead", "re"}, "requeue\n"},
		{[]string{"review", "resolve", "--note", "st", "--o"}, ""},
	} {
		code, out, errs := run(t, append([]string{"__complete", "--"}, tc.words...)...)
		if code != 0 || out != tc.want {
			t.Errorf("__complete %q: exit %d, %q, want %q\n%s", tc.words, code, out, tc.want, errs)
		}
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed to check the bash completion script")
	}
	code, script, errs := run(t, "completion", "bash")
	if code != 0 || !strings.Contains(script, "__complete") {
		t.Fatalf("completion bash: exit %d\n%s%s", code, script, errs)
	}
	f := filepath.Join(t.TempDir(), "idemctl.bash")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bash, "-n", f).CombinedOutput(); err != nil {
		t.Errorf("bash -n: %v\n%s", err, out)
	}
	for _, shell := range []string{"zsh", "fish"} {
		if code, out, _ := run(t, "completion", shell); code != 0 || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: exit %d\n%s", shell, code, out)
		}
	}
	if code, _, _ := run(t, "completion", "tcsh"); code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2", code)
	}
}

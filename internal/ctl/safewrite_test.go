package ctl_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/ctl"
)

// fromEnvAllowed are the only flags of a write command that may come from
// the environment: who acts and why, which the command then prints the
// source of, and the completer's setting that decides whether a key may be
// retried. None of them chooses what the command changes.
var fromEnvAllowed = []string{"by", "note", "give-up-after"}

// TestWriteTargetsNeverFromEnv walks idemctl's whole command model: every
// command that records an operator (it has --by) is a write command, and
// none of its own flags or arguments but fromEnvAllowed reads an
// environment variable. A new write command, or a new flag on one, is
// checked without being listed here.
func TestWriteTargetsNeverFromEnv(t *testing.T) {
	app, err := config.Model("idemctl", &ctl.CLI{})
	if err != nil {
		t.Fatal(err)
	}
	var writes []string
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		if slices.ContainsFunc(n.Flags, func(f *kong.Flag) bool { return f.Name == "by" }) {
			writes = append(writes, n.FullPath())
			for _, f := range n.Flags {
				if len(f.Envs) > 0 && !slices.Contains(fromEnvAllowed, f.Name) {
					t.Errorf("%s: --%s reads %v: a write command's target must come from its arguments only", n.FullPath(), f.Name, f.Envs)
				}
			}
			for _, a := range n.Positional {
				if len(a.Tag.Envs) > 0 {
					t.Errorf("%s: <%s> reads %v: a write command's target must come from its arguments only", n.FullPath(), a.Name, a.Tag.Envs)
				}
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	// The walk found the write commands there are; fewer would mean the
	// rule above no longer finds them.
	for _, want := range []string{"idemctl keys retry", "idemctl dead requeue", "idemctl review resolve"} {
		if !slices.Contains(writes, want) {
			t.Errorf("write command %q not found by the walk (found %v)", want, writes)
		}
	}
}

// TestLeftoverEnvChoosesNothing is the report: with every
// variable a careless shell could hold set, a write command given no
// target refuses (exit 2) instead of acting on the one the variables name.
func TestLeftoverEnvChoosesNothing(t *testing.T) {
	for k, v := range map[string]string{
		"IDEMD_ID": "5", "IDEMD_USER_ID": "9", "IDEMD_KEY": "k1",
		"IDEMD_OPERATOR": "someone", "IDEMD_NOTE": "leftover",
	} {
		t.Setenv(k, v)
	}
	db := []string{"--database-url", "postgres://127.0.0.1:1/none"}
	for _, cmd := range [][]string{{"keys", "retry"}, {"dead", "requeue"}, {"review", "resolve"}} {
		code, out, errs := run(t, append(db, cmd...)...)
		if code != 2 || out != "" {
			t.Errorf("%s with targets only in the environment: exit %d, want 2 (usage)\n%s%s", strings.Join(cmd, " "), code, out, errs)
		}
	}
}

// TestWriteSaysWhereOperatorCameFrom: the operator and the note may come
// from the environment, and the command says so before it acts.
func TestWriteSaysWhereOperatorCameFrom(t *testing.T) {
	url, _ := setup(t)
	t.Setenv("IDEMD_OPERATOR", "someone")
	t.Setenv("IDEMD_NOTE", "leftover")
	_, _, errs := run(t, "--database-url", url, "review", "resolve", "999999")
	if want := `acting as "someone" (from IDEMD_OPERATOR), note from IDEMD_NOTE`; !strings.Contains(errs, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errs)
	}
	_, _, errs = run(t, "--database-url", url, "review", "resolve", "999999", "--by", "alice", "--note", "checked")
	if want := `acting as "alice" (from --by), note from --note`; !strings.Contains(errs, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errs)
	}
}

package ctl

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/operator"
)

// Output is the -o/--output flag of every read command: text for people,
// json for scripts (the field names are the json tags of the printed type).
// --format is its deprecated spelling (status and review list had it),
// hidden and read from the command line only; Main warns when it is used.
type Output struct {
	Output string `name:"output" short:"o" default:"text" enum:"text,json" help:"Output: text (for people) or json (for scripts)."`
	Format string `name:"format" hidden:"" env:"-" default:"" enum:",table,text,json" help:"Deprecated spelling of -o (table is text)."`
}

// JSON reports whether -o json (or the deprecated --format json) was given.
func (o Output) JSON() bool { return o.Output == "json" || o.Format == "json" }

// Operator are the flags of every state-changing command: who does it and
// why, both recorded. The identity is never taken from the OS user: an
// action recorded as "root" or "ubuntu" from a shared bastion tells no one
// who acted. These two, and only these, of a write command may come from
// the environment (its target never does: TestWriteTargetsNeverFromEnv),
// and the command says where it took each from (announce).
type Operator struct {
	By   string `name:"by" env:"IDEMD_OPERATOR" help:"Who does this, recorded with the action (env IDEMD_OPERATOR). Required; the OS user is never assumed."`
	Note string `name:"note" env:"IDEMD_NOTE" help:"Why this is safe now, recorded with the action (env IDEMD_NOTE). Required."`
}

// announce prints on stderr where the operator and the note were taken
// from, so that a value left in the environment is seen before it is
// recorded.
func (o Operator) announce(g *Globals) {
	fmt.Fprintf(g.Stderr, "idemctl: acting as %q (from %s), note from %s\n", strings.TrimSpace(o.By), g.source("by"), g.source("note"))
}

// problems lists what is missing from the operator flags.
func (o Operator) problems() []string {
	var p []string
	if strings.TrimSpace(o.By) == "" {
		p = append(p, "--by (or IDEMD_OPERATOR) is required: who does this is recorded, and the OS user is never assumed")
	}
	if strings.TrimSpace(o.Note) == "" {
		p = append(p, "--note is required: say why this is safe now")
	}
	return p
}

// actor is the operator.Actor of an idemctl command.
func (o Operator) actor() operator.Actor {
	return operator.Actor{By: strings.TrimSpace(o.By), Via: operator.ViaIdemctl}
}

// ts renders a time the way every idemctl table does, "-" for none.
func ts(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// since renders the age of t at now, "-" for none.
func since(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	return operator.Age(now.Sub(*t))
}

// orDash is s, or "-" when empty or nil.
func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

// writeLines writes label/value pairs aligned, for the text reports.
func writeLines(w io.Writer, pairs [][2]string) {
	width := 0
	for _, p := range pairs {
		width = max(width, len(p[0]))
	}
	for _, p := range pairs {
		fmt.Fprintf(w, "%-*s  %s\n", width, p[0], p[1])
	}
}

// named is err named by the command that failed, once: the operator core
// names most of its errors by the same operation already, and "keys show:
// keys show: ..." tells the operator nothing twice.
func named(op string, err error) error {
	if err == nil || strings.HasPrefix(err.Error(), op+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", op, err)
}

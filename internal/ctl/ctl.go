// Package ctl implements idemctl's subcommands.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/logging"
	"github.com/idemd/idemd/internal/migrate"
)

// CLI is idemctl's command tree.
type CLI struct {
	config.Database `embed:""`
	config.Logging  `embed:""`

	Migrate MigrateCmd `cmd:"" help:"Apply idemd's and River's migrations (safe to run twice or concurrently)."`
	Status  StatusCmd  `cmd:"" help:"Show staged-job backlog, unfinished keys by recovery point, keys past retention and open reviews."`
	Review  ReviewCmd  `cmd:"" help:"List and resolve idempotency keys flagged for review."`
	Keys    KeysCmd    `cmd:"" help:"Show one key, or hand a given-up key back to the completer."`
	Dead    DeadCmd    `cmd:"" help:"List, show and requeue dead-lettered staged jobs."`
	Reaper  ReaperCmd  `cmd:"" help:"The reaper's run history (reaper runs); pause and resume every reaper run (reaper pause|resume)."`
	Console ConsoleCmd `cmd:"" help:"Serve the web console: status, review queue, key lookup, dead letters, River's UI (docs/console.md)."`

	Conformance ConformanceCmd `cmd:"" help:"Check a running API against the idempotency-key protocol, scenario by scenario (docs/conformance.md)."`

	HelpCommand HelpCmd       `cmd:"" name:"help" help:"Show the help of idemctl or of a command (idemctl help keys retry)."`
	Version     VersionCmd    `cmd:"" help:"Print the version, commit and Go version."`
	Completion  CompletionCmd `cmd:"" help:"Print the completion script of a shell: bash, zsh or fish."`
	Complete    CompleteCmd   `cmd:"" name:"__complete" hidden:"" help:"What the completion scripts call."`
}

// Check reports configuration problems. conformance needs no database
// (without one it checks what a client sees), completion none at all.
func (c *CLI) Check() []string {
	p := c.Database.Check()
	offline := c.Conformance.selected || c.HelpCommand.selected || c.Version.selected ||
		c.Completion.selected || c.Complete.selected
	if offline && strings.TrimSpace(c.DatabaseURL) == "" {
		p = slices.DeleteFunc(p, func(s string) bool { return strings.HasPrefix(s, "--database-url") })
	}
	return p
}

// DatabaseNeed implements config.DatabaseSometimes: --help says which
// commands need --database-url.
func (c *CLI) DatabaseNeed() string {
	return "Required by every command but conformance (optional there), help, version and completion."
}

// Globals is bound into every subcommand's Run.
type Globals struct {
	Pool   *pgxpool.Pool
	Pooler string // --pooler: what Pool goes through
	// Calls bounds the database calls (--database-timeout): the whole of
	// a command that reads or changes a few rows (boundedCommand), the
	// calls around the migrations (migrate.Options.Calls), each page of
	// the console.
	Calls  *dbcall.Bounds
	Logger *zap.Logger
	Stdout io.Writer
	Stderr io.Writer
	// Kctx is the parsed command line, for where a value came from
	// (source).
	Kctx *kong.Context
	// HasDatabase is false when no --database-url was given (only
	// conformance runs so): Pool then reaches nothing useful.
	HasDatabase bool
}

// MigrateCmd applies migrations.
//
// Its wait for a concurrent migration is --lock-wait (IDEMD_LOCK_WAIT):
// IDEMD_LOCK_TIMEOUT is the completer's, the age of a key's lock, and one
// variable must not mean two things to two commands. --lock-timeout is the
// deprecated spelling, read from the command line only.
type MigrateCmd struct {
	LockWait time.Duration `name:"lock-wait" default:"5m" help:"How long to wait for a concurrent migration to finish, and then to retry migrations whose table lock was not granted within --ddl-lock-timeout."`
	// DDLLockTimeout is not --lock-timeout (the deprecated spelling of
	// --lock-wait) nor IDEMD_LOCK_TIMEOUT (the completer's).
	DDLLockTimeout time.Duration `name:"ddl-lock-timeout" default:"2s" help:"Every migration statement's lock_timeout: the longest the API's statements on a table queue behind a migration's lock request. A statement not granted its lock in time is retried, with backoff, until --lock-wait."`
	LockTimeout    time.Duration `name:"lock-timeout" hidden:"" env:"-" help:"Deprecated spelling of --lock-wait."`
	// PrintSQL is read from the command line only: a variable left set
	// must not turn the migration Job into one that applies nothing.
	PrintSQL bool       `name:"print-sql" env:"-" help:"Apply nothing: print the pending River and idemd migrations, each with the statement that records it as applied, and the grants, as SQL to apply with your own tool (Flyway, Atlas, goose, psql). Nothing is printed when nothing is pending."`
	Adopt    AdoptFlags `embed:"" prefix:"adopt-"` // adopt.go
}

// wait is --lock-wait, or the deprecated --lock-timeout when that was given.
func (m *MigrateCmd) wait() time.Duration {
	if m.LockTimeout > 0 {
		return m.LockTimeout
	}
	return m.LockWait
}

// Run applies the migrations and then the grants on their tables.
func (m *MigrateCmd) Run(ctx context.Context, g *Globals) error {
	if m.PrintSQL {
		if m.Adopt.ArticleSchema {
			return &config.Error{Problems: []string{"--print-sql and --adopt-article-schema exclude each other: the adoption is an online backfill, not SQL to print"}}
		}
		var sql string
		err := g.Calls.Do(ctx, "idemctl migrate --print-sql", func(ctx context.Context) (err error) {
			sql, err = migrate.PendingSQL(ctx, g.Pool)
			return err
		})
		if err != nil {
			return err
		}
		if sql == "" {
			fmt.Fprintln(g.Stderr, "migrate: nothing pending; no SQL to print")
			return nil
		}
		_, err = fmt.Fprint(g.Stdout, sql)
		return err
	}
	if m.DDLLockTimeout <= 0 {
		return &config.Error{Problems: []string{fmt.Sprintf("--ddl-lock-timeout must be positive, got %s", m.DDLLockTimeout)}}
	}
	res, err := migrate.Up(ctx, g.Pool, migrate.Options{
		LockWait: m.wait(), DDLLockTimeout: m.DDLLockTimeout,
		TransactionPooler: g.Pooler == config.PoolerTransaction, Logger: logging.Slog(g.Logger), Calls: g.Calls,
	})
	// A login role that may not act as idemd_migrator is the Job's
	// configuration (the runtime's secret given to it, say): exit 2, which
	// running it again does not change.
	var roleErr *migrate.RoleError
	if errors.As(err, &roleErr) {
		return &config.Error{Problems: []string{roleErr.Error()}}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(g.Stdout, "migrate: applied %d River and %d idemd migrations, and the grants on their tables", len(res.RiverVersions), len(res.IdemdVersions))
	if res.LockRetries > 0 {
		fmt.Fprintf(g.Stdout, " (%d retries after a table lock was not granted within --ddl-lock-timeout)", res.LockRetries)
	}
	fmt.Fprintln(g.Stdout)
	return m.Adopt.run(ctx, g, m.wait())
}

// deprecatedFlags are spellings kept for one release: they still work, and
// using one prints what replaces it.
var deprecatedFlags = map[string]string{
	"--format":       "-o/--output (text or json)",
	"--lock-timeout": "--lock-wait (env IDEMD_LOCK_WAIT)",
}

// warnDeprecated tells on stderr which deprecated flags args use.
func warnDeprecated(args []string, stderr io.Writer) {
	for _, a := range args {
		if a == "--" {
			return
		}
		name, _, _ := strings.Cut(a, "=")
		if repl, ok := deprecatedFlags[name]; ok {
			fmt.Fprintf(stderr, "idemctl: %s is deprecated and will be removed in the next release; use %s\n", name, repl)
		}
	}
}

// once drops a line of an error's text that repeats the line before it:
// pgx reports each connection attempt (with sslmode=prefer, TLS then
// plain text) and two failures alike are one failure to the operator.
func once(text string) string {
	lines := strings.Split(text, "\n")
	out := lines[:1]
	for _, l := range lines[1:] {
		if l != out[len(out)-1] {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// fromDefault is source's answer for a flag given nowhere.
const fromDefault = "its default"

// source says where the value of flag name (without --) was taken from:
// the command line, its environment variable, or nowhere (fromDefault).
func (g *Globals) source(name string) string {
	if g.Kctx == nil {
		return fromDefault
	}
	for _, p := range g.Kctx.Path {
		if p.Flag != nil && p.Flag.Name == name {
			return "--" + name
		}
	}
	for _, f := range g.Kctx.Flags() {
		if f.Name != name {
			continue
		}
		for _, env := range f.Tag.Envs {
			if v, ok := os.LookupEnv(env); ok && v != "" {
				return env
			}
		}
	}
	return fromDefault
}

// run runs the command kctx selected. A command that reads or changes a
// few rows (status, review, keys, dead, reaper runs|pause|resume) is one
// call bounded by --database-timeout as a whole, so a database that does
// not answer fails it with the reason instead of hanging a terminal or a
// script; migrate and the console bound their own calls, and the
// commands without a database have none.
func run(ctx context.Context, kctx *kong.Context, g *Globals) error {
	cmd, bounded := boundedCommand(kctx)
	if !bounded {
		kctx.BindTo(ctx, (*context.Context)(nil))
		return kctx.Run(g)
	}
	return g.Calls.Do(ctx, "idemctl "+cmd, func(ctx context.Context) error {
		kctx.BindTo(ctx, (*context.Context)(nil))
		return kctx.Run(g)
	})
}

// unboundedCommands run longer than one call by design, or reach no
// database.
var unboundedCommands = []string{"migrate", "console", "conformance", "help", "version", "completion", "__complete"}

// boundedCommand is the selected command's name without its arguments
// (keys retry), and whether run bounds it as one call.
func boundedCommand(kctx *kong.Context) (string, bool) {
	var words []string
	for _, w := range strings.Fields(kctx.Command()) {
		if !strings.HasPrefix(w, "<") {
			words = append(words, w)
		}
	}
	if len(words) == 0 || slices.Contains(unboundedCommands, words[0]) {
		return "", false
	}
	return strings.Join(words, " "), true
}

// Main runs idemctl and returns its exit code. With no arguments it prints
// the help (exit 0): a bare command is a question, not a mistake.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		args = []string{"--help"}
	}
	warnDeprecated(args, stderr)
	cli := &CLI{}
	kctx, base, code := daemon.Setup("idemctl", "Operate idemd: migrate the schema, show status, review flagged keys.",
		cli, &cli.Database, &cli.Logging, args, stdout, stderr)
	if base == nil {
		return code
	}
	defer base.Close()
	for _, u := range base.UnknownEnv {
		fmt.Fprintf(stderr, "idemctl: warning: %s\n", u)
	}

	g := &Globals{Pool: base.Pool, Pooler: cli.Database.Pooler, Calls: base.Calls, Logger: base.Logger, Stdout: stdout, Stderr: stderr, Kctx: kctx,
		HasDatabase: strings.TrimSpace(cli.DatabaseURL) != ""}
	err := daemon.SchemaHint(run(base.Ctx, kctx, g))
	var printed exitStatus
	if errors.As(err, &printed) {
		return int(printed)
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %s\n", once(err.Error()))
	}
	return daemon.ExitCode(err)
}

// Package ctl implements idemctl's subcommands.
package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
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
}

// Check reports configuration problems. conformance needs no database:
// without one it checks what a client sees.
func (c *CLI) Check() []string {
	p := c.Database.Check()
	if c.Conformance.selected && strings.TrimSpace(c.DatabaseURL) == "" {
		p = slices.DeleteFunc(p, func(s string) bool { return strings.HasPrefix(s, "--database-url") })
	}
	return p
}

// Globals is bound into every subcommand's Run.
type Globals struct {
	Pool   *pgxpool.Pool
	Pooler string // --pooler: what Pool goes through
	Logger *zap.Logger
	Stdout io.Writer
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
	Adopt          AdoptFlags    `embed:"" prefix:"adopt-"` // adopt.go
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
	if m.DDLLockTimeout <= 0 {
		return &config.Error{Problems: []string{fmt.Sprintf("--ddl-lock-timeout must be positive, got %s", m.DDLLockTimeout)}}
	}
	res, err := migrate.Up(ctx, g.Pool, migrate.Options{
		LockWait: m.wait(), DDLLockTimeout: m.DDLLockTimeout,
		TransactionPooler: g.Pooler == config.PoolerTransaction, Logger: logging.Slog(g.Logger),
	})
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

	g := &Globals{Pool: base.Pool, Pooler: cli.Database.Pooler, Logger: base.Logger, Stdout: stdout, HasDatabase: strings.TrimSpace(cli.DatabaseURL) != ""}
	kctx.BindTo(base.Ctx, (*context.Context)(nil))
	err := daemon.SchemaHint(kctx.Run(g))
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
	}
	return daemon.ExitCode(err)
}

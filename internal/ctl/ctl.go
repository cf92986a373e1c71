// Package ctl implements idemctl's subcommands.
package ctl

import (
	"context"
	"fmt"
	"io"
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
	Reaper  ReaperCmd  `cmd:"" help:"The reaper's run history (reaper runs)."`
	Console ConsoleCmd `cmd:"" help:"Serve the web console: status, review queue, key lookup, dead letters, River's UI (docs/console.md)."`
}

// Check reports configuration problems.
func (c *CLI) Check() []string { return c.Database.Check() }

// Globals is bound into every subcommand's Run.
type Globals struct {
	Pool   *pgxpool.Pool
	Logger *zap.Logger
	Stdout io.Writer
}

// MigrateCmd applies migrations.
type MigrateCmd struct {
	LockTimeout time.Duration `name:"lock-timeout" default:"5m" help:"How long to wait for a concurrent migration to finish."`
	Adopt       AdoptFlags    `embed:"" prefix:"adopt-"` // adopt.go
}

// Run applies the migrations.
func (m *MigrateCmd) Run(ctx context.Context, g *Globals) error {
	res, err := migrate.Up(ctx, g.Pool, migrate.Options{LockTimeout: m.LockTimeout, Logger: logging.Slog(g.Logger)})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.Stdout, "migrate: applied %d River and %d idemd migrations\n", len(res.RiverVersions), len(res.IdemdVersions))
	return m.Adopt.run(ctx, g, m.LockTimeout)
}

// Main runs idemctl and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	cli := &CLI{}
	kctx, base, code := daemon.Setup("idemctl", "Operate idemd: migrate the schema, show status, review flagged keys.",
		cli, &cli.Database, &cli.Logging, args, stdout, stderr)
	if base == nil {
		return code
	}
	defer base.Close()

	g := &Globals{Pool: base.Pool, Logger: base.Logger, Stdout: stdout}
	kctx.BindTo(base.Ctx, (*context.Context)(nil))
	err := daemon.SchemaHint(kctx.Run(g))
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
	}
	return daemon.ExitCode(err)
}

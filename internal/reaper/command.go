package reaper

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
)

// Description is the reaper's --help summary.
const Description = "Delete idempotency keys past the retention window in bounded batches, " +
	"flagging unfinished and given-up keys for review in the same statement. " +
	"One run and exit by default (CronJob, manual run); --schedule keeps running (Deployment)."

// Command is the reaper's command line, run by daemon.Main.
type Command struct {
	config.Common `embed:""`
	Settings      `embed:""`
	// Once is the default without --schedule; the flag only says so
	// explicitly (a CronJob's args), so it is no setting of the service.
	Once bool `name:"once" help:"Do one run and exit (the default when --schedule is not set; for a CronJob or a manual run)."`
}

// CommonConfig implements daemon.Command.
func (c *Command) CommonConfig() *config.Common { return &c.Common }

// LongRunning implements daemon.Command: only --schedule keeps the reaper
// running (a one-shot run serves no HTTP unless asked; --dry-run cannot be
// combined with --schedule).
func (c *Command) LongRunning() bool { return c.Schedule != "" }

// OldestSchema implements daemon.SchemaFloor.
func (c *Command) OldestSchema() int64 { return OldestSchema }

// OldestSchema is the lowest idemd migration the reaper runs on:
// 00030_idemd_reaper_throttle.sql, the throttle's columns of the run
// history and the operator's pause every run reads; it also needs the run
// history (00016), idemd_leases (00011, the run lease) and the key_id
// index of idempotency_key_reviews (00010), without which every flag check
// scans the reviews. On a schema before 00031 a run is recorded without
// its retention and lock window (runhistory.Start), which readers then
// take from their own flags.
const OldestSchema = 30

// FlagDefaults implements config.Defaulter: the flags' defaults are the
// service's.
func (c *Command) FlagDefaults() any { return DefaultSettings() }

// Check reports every problem with the flags at once (exit 2).
func (c *Command) Check() []string {
	p := append(c.Common.Check(), c.Settings.Check()...)
	if c.Once && c.Schedule != "" {
		p = append(p, "--once and --schedule are mutually exclusive")
	}
	return p
}

// Run does one run, or runs on the schedule until SIGTERM.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	replicas, closeReplicas, err := OpenReplicas(ctx, &c.Throttle, env.Pool.Config())
	if err != nil {
		return err
	}
	defer closeReplicas()
	svc, err := New(Config{
		Settings: c.Settings,
		Pool:     env.Pool,
		Calls:    env.Calls,
		Logger:   env.Logger,
		Registry: env.Registry,
		Ready:    env.Ready,
		Replicas: replicas,
	})
	if err != nil {
		return err
	}
	if c.Schedule != "" {
		env.Logger.Info("reaper scheduled", zap.String("schedule", c.Schedule))
		return daemon.RunService(ctx, svc, c.ShutdownTimeout)
	}
	// RunOnce logged the run's summary line, with the error if any.
	res, err := svc.RunOnce(ctx)
	if err == nil && res.Plan != nil {
		if werr := writeDryRun(env.Stdout, &c.Settings, res.Plan); werr != nil {
			return fmt.Errorf("reaper: dry run output: %w", werr)
		}
	}
	return daemon.AlreadyLogged(err)
}

// writeDryRun prints a dry run's plan for an operator.
func writeDryRun(out io.Writer, s *Settings, p *Plan) error {
	fmt.Fprintf(out, "dry run: nothing was changed\n")
	fmt.Fprintf(out, "would delete %d keys older than %s (locked keys and keys leased by the completer are skipped)\n", p.Deletes, s.Retention)
	fmt.Fprintf(out, "would flag %d keys for review\n", p.Flags)
	if s.MaxDeletes > 0 && p.Deletes > s.MaxDeletes {
		fmt.Fprintf(out, "a real run would refuse: %d exceeds --max-deletes %d\n", p.Deletes, s.MaxDeletes)
	}
	if s.MaxFlags > 0 && p.Flags > s.MaxFlags {
		fmt.Fprintf(out, "a real run would refuse: %d exceeds --max-flags %d\n", p.Flags, s.MaxFlags)
	}
	if len(p.ToFlag) == 0 {
		return nil
	}
	fmt.Fprintf(out, "keys that would be flagged (oldest first")
	if int64(len(p.ToFlag)) < p.Flags {
		fmt.Fprintf(out, ", first %d of %d", len(p.ToFlag), p.Flags)
	}
	fmt.Fprintf(out, "):\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY_ID\tUSER_ID\tIDEMPOTENCY_KEY\tRECOVERY_POINT\tCREATED_AT\tREASON")
	for _, k := range p.ToFlag {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", k.ID, k.UserID, k.IdempotencyKey, k.RecoveryPoint, k.CreatedAt.UTC().Format(time.RFC3339), k.Reason)
	}
	return tw.Flush()
}

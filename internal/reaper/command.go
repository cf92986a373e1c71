package reaper

import (
	"context"
	"fmt"
	"time"

	"idemd/internal/config"
	"idemd/internal/daemon"
)

// Description is the reaper's --help summary.
const Description = "Delete idempotency keys past the retention window in bounded batches, " +
	"flagging unfinished and given-up keys for review in the same statement. " +
	"One run and exit by default (CronJob, manual run); --schedule keeps running (Deployment)."

// Command is the reaper's command line, run by daemon.Main.
type Command struct {
	config.Common `embed:""`
	Settings      `embed:""`
}

// CommonConfig implements daemon.Command.
func (c *Command) CommonConfig() *config.Common { return &c.Common }

// Check reports every problem with the flags at once (exit 2).
func (c *Command) Check() []string {
	return append(c.Common.Check(), c.Settings.Check()...)
}

// Run does one run, or runs on the schedule until SIGTERM.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	svc, err := New(Config{
		Settings: c.Settings,
		Pool:     env.Pool,
		Logger:   env.Logger,
		Registry: env.Registry,
		Stdout:   env.Stdout,
		Ready:    env.Ready,
	})
	if err != nil {
		return err
	}
	env.Ready.MarkStarted(time.Now())
	if c.Schedule == "" {
		// RunOnce logged the run's summary line, with the error if any.
		_, err := svc.RunOnce(ctx)
		return daemon.AlreadyLogged(err)
	}
	// Not ready when two scheduled runs in a row have not happened.
	sched, err := cronParser.Parse(c.Schedule)
	if err != nil {
		return &config.Error{Problems: []string{fmt.Sprintf("--schedule %q: %v", c.Schedule, err)}}
	}
	now := time.Now()
	next := sched.Next(now)
	env.Ready.MaxPassAge = 2*sched.Next(next).Sub(next) + c.MaxRuntime
	return daemon.RunService(ctx, svc, c.ShutdownTimeout)
}

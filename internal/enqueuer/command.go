package enqueuer

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
)

// Description is the enqueuer's --help summary.
const Description = "Move committed rows of staged_jobs into River, exactly once."

// Command is the enqueuer's command line, run by daemon.Main. Every flag
// also reads IDEMD_<NAME> (e.g. IDEMD_BATCH_SIZE, IDEMD_POLL_INTERVAL).
type Command struct {
	config.Common `embed:""`
	Settings      `embed:""`

	Once bool `name:"once" help:"Drain until staged_jobs is empty, then exit."`
}

// CommonConfig implements daemon.Command.
func (c *Command) CommonConfig() *config.Common { return &c.Common }

// LongRunning implements daemon.Command: without --once the enqueuer runs
// until SIGTERM and serves /metrics on the default address.
func (c *Command) LongRunning() bool { return !c.Once }

// OldestSchema implements daemon.SchemaFloor.
func (c *Command) OldestSchema() int64 { return OldestSchema }

// OldestSchema is the lowest idemd migration the enqueuer runs on:
// 00021_staged_jobs_unique.sql, whose unique_key and unique_states columns
// the move reads and whose idemd_move_check the move calls to prove it
// wrote a River job for every row it took. Below it /readyz fails and
// names `idemctl migrate`; migrations are additive, so the previous
// release's enqueuer runs on it unchanged (and ignores the unique columns:
// docs/enqueuer.md, "Unique jobs").
const OldestSchema = 21

// FlagDefaults implements config.Defaulter: the flags' defaults are the
// service's.
func (c *Command) FlagDefaults() any { return DefaultSettings() }

// Check reports every problem with the flags at once (exit 2).
func (c *Command) Check() []string {
	return append(c.Common.Check(), c.Settings.Check()...)
}

// Run drains once (--once), or runs until SIGTERM.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	settings := c.Settings
	switch {
	case settings.PollOnly:
		env.Logger.Info("polling only (--poll-only): staged jobs wait up to --poll-interval", zap.Duration("poll_interval", settings.PollInterval))
	case settings.ListenDatabaseURL == "" && c.Pooler == config.PoolerTransaction:
		// LISTEN through a transaction-mode pooler lands on a server
		// connection the pooler hands to other clients: it is left there
		// for the API's connections, and nothing is heard.
		settings.PollOnly = true
		env.Logger.Warn("--pooler transaction without --listen-database-url: not listening, staged jobs wait up to --poll-interval; "+
			"give --listen-database-url a direct or session-mode URL for millisecond wake-ups", zap.Duration("poll_interval", settings.PollInterval))
	}
	svc, err := New(Config{
		Settings: settings,
		Pool:     env.Pool,
		Logger:   env.Logger,
		Registry: env.Registry,
		Ready:    env.Ready,
	})
	if err != nil {
		return err
	}
	if c.Once {
		// The pass logged its failure, if any.
		start := time.Now()
		res, err := svc.RunOnce(ctx)
		if err != nil {
			return daemon.AlreadyLogged(err)
		}
		env.Logger.Info("drained", append(res.fields(), zap.Duration("duration", time.Since(start)))...)
		return nil
	}
	env.Logger.Info("enqueuer started", zap.Int("batch_size", settings.BatchSize), zap.Duration("poll_interval", settings.PollInterval),
		zap.Int("max_args_bytes", settings.MaxArgsBytes))
	if err := daemon.RunService(ctx, svc, c.ShutdownTimeout); err != nil {
		return err
	}
	env.Logger.Info("enqueuer stopped")
	return nil
}

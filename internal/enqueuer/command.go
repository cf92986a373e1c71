package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
)

// Description is the enqueuer's --help summary.
const Description = "Move committed rows of staged_jobs into River, exactly once."

// Command is the enqueuer's command line, run by daemon.Main. Every flag
// also reads IDEMD_<NAME> (e.g. IDEMD_BATCH_SIZE, IDEMD_SWEEP_INTERVAL).
type Command struct {
	config.Common `embed:""`
	Settings      `embed:""`
	Deprecated    deprecatedSettings `embed:""`

	Once bool `name:"once" help:"Drain until staged_jobs is empty, then exit."`
}

// deprecatedSettings are the spellings of 0.1.0 and earlier 0.2.0 builds,
// kept for one release so that a Deployment written for them still starts:
// --poll-interval did not say it is the sweep's cadence, and
// --polling-interval did not say how it differs from it. Each reads its
// old IDEMD_ variable too (kong's DefaultEnvars). Hidden from --help; using
// one logs a warning naming what replaces it. A pointer tells "not given"
// from a given 0 (--polling-interval 0 turns busy polling off).
type deprecatedSettings struct {
	PollInterval    *time.Duration `name:"poll-interval" hidden:"" help:"Deprecated spelling of --sweep-interval."`
	PollingInterval *time.Duration `name:"polling-interval" hidden:"" help:"Deprecated spelling of --busy-poll-interval."`
}

// deprecatedAlias is one deprecated spelling, its replacement, and where
// the value goes.
type deprecatedAlias struct {
	old, oldEnv, repl, replEnv string
	value                      *time.Duration
	target                     func(*Settings) *time.Duration
}

func (d *deprecatedSettings) aliases() []deprecatedAlias {
	return []deprecatedAlias{
		{"--poll-interval", "IDEMD_POLL_INTERVAL", "--sweep-interval", "IDEMD_SWEEP_INTERVAL", d.PollInterval,
			func(s *Settings) *time.Duration { return &s.SweepInterval }},
		{"--polling-interval", "IDEMD_POLLING_INTERVAL", "--busy-poll-interval", "IDEMD_BUSY_POLL_INTERVAL", d.PollingInterval,
			func(s *Settings) *time.Duration { return &s.BusyPollInterval }},
	}
}

// settings are the flags' settings with any deprecated spelling applied:
// a value given under the old name wins over the new name's default, as
// it did before the rename.
func (c *Command) settings() Settings {
	s := c.Settings
	for _, a := range c.Deprecated.aliases() {
		if a.value != nil {
			*a.target(&s) = *a.value
		}
	}
	return s
}

// deprecationWarnings are the lines to log for the deprecated spellings in
// use, one each.
func (c *Command) deprecationWarnings() []string {
	var w []string
	for _, a := range c.Deprecated.aliases() {
		if a.value != nil {
			w = append(w, fmt.Sprintf("%s (%s) is deprecated and will be removed in the next release; use %s (%s)", a.old, a.oldEnv, a.repl, a.replEnv))
		}
	}
	return w
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
	s := c.settings()
	p := s.Check()
	// A value given under a deprecated spelling is judged under the name
	// the operator typed.
	for _, a := range c.Deprecated.aliases() {
		if a.value == nil {
			continue
		}
		for i := range p {
			p[i] = strings.ReplaceAll(p[i], a.repl, a.old)
		}
	}
	return append(c.Common.Check(), p...)
}

// Run drains once (--once), or runs until SIGTERM.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	for _, w := range c.deprecationWarnings() {
		env.Logger.Warn(w)
	}
	settings := c.settings()
	switch {
	case settings.PollOnly:
		env.Logger.Info("polling only (--poll-only): staged jobs wait up to --sweep-interval", zap.Duration("sweep_interval", settings.SweepInterval))
	case settings.ListenDatabaseURL == "" && c.Pooler == config.PoolerTransaction:
		// LISTEN through a transaction-mode pooler lands on a server
		// connection the pooler hands to other clients: it is left there
		// for the API's connections, and nothing is heard.
		settings.PollOnly = true
		env.Logger.Warn("--pooler transaction without --listen-database-url: not listening, staged jobs wait up to --sweep-interval; "+
			"give --listen-database-url a direct or session-mode URL for millisecond wake-ups", zap.Duration("sweep_interval", settings.SweepInterval))
	}
	svc, err := New(Config{
		Settings: settings,
		Pool:     env.Pool,
		Calls:    env.Calls,
		Logger:   env.Logger,
		Registry: env.Registry,
		Ready:    env.Ready,
	})
	if err != nil {
		return err
	}
	if c.Once {
		// The pass logged its failure, if any. Its summary line is at
		// debug level, for the loop's many passes; --once says at info
		// what its one pass did, unless the pass's own line was written
		// (rows moved, debug on): one line either way.
		start := time.Now()
		res, err := svc.RunOnce(ctx)
		if err != nil {
			return daemon.AlreadyLogged(err)
		}
		if res.taken() == 0 || !env.Logger.Core().Enabled(zap.DebugLevel) {
			env.Logger.Info("enqueuer pass", append(res.fields(), zap.Duration("duration", time.Since(start)))...)
		}
		return nil
	}
	env.Logger.Info("enqueuer started", zap.Int("batch_size", settings.BatchSize), zap.Duration("sweep_interval", settings.SweepInterval),
		zap.Int("max_args_bytes", settings.MaxArgsBytes))
	if err := daemon.RunService(ctx, svc, c.ShutdownTimeout); err != nil {
		return err
	}
	env.Logger.Info("enqueuer stopped")
	return nil
}

package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"idemd/internal/config"
	"idemd/internal/daemon"
)

// CLI is the enqueuer command's configuration (flags, IDEMD_ env).
type CLI struct {
	config.Common `embed:""`

	BatchSize     int           `name:"batch-size" default:"5000" help:"Most staged rows moved per transaction."`
	Workers       int           `name:"workers" default:"2" help:"Batches moved at once while draining, each on its own connection."`
	PollInterval  time.Duration `name:"poll-interval" default:"2s" help:"Fallback poll when no NOTIFY arrives (notifications are the normal wake-up)."`
	AllowedKinds  []string      `name:"allowed-kinds" sep:"," help:"Comma-separated job kinds to accept; others are dead-lettered. Empty accepts any kind."`
	MaxArgsBytes  int           `name:"max-args-bytes" default:"262144" help:"Dead-letter staged rows whose job_args exceed this many bytes."`
	StatsInterval time.Duration `name:"stats-interval" default:"5s" help:"How often the backlog gauges are refreshed."`
	Once          bool          `name:"once" help:"Drain until staged_jobs is empty, then exit."`

	ListenDatabaseURL     string        `name:"listen-database-url" help:"Connection URL for LISTEN only: a direct or session-mode URL when --database-url goes through a transaction-mode pooler. Empty: the --database-url connection (with --pooler transaction, no listening: wake every --poll-interval)."`
	PollOnly              bool          `name:"poll-only" help:"Do not LISTEN; wake every --poll-interval. For setups where no connection can LISTEN."`
	ListenerCheckInterval time.Duration `name:"listener-check-interval" default:"30s" help:"How often the listener sends itself a NOTIFY through the pool to prove notifications arrive; one that does not come back within 5s marks the listener down and reconnects it."`
}

// CommonConfig implements daemon.Command.
func (c *CLI) CommonConfig() *config.Common { return &c.Common }

// LongRunning implements daemon.Command: without --once the enqueuer runs
// until SIGTERM and serves /metrics on the default address.
func (c *CLI) LongRunning() bool { return !c.Once }

// Check lists every configuration problem.
func (c *CLI) Check() []string {
	p := c.Common.Check()
	if c.BatchSize < 1 || c.BatchSize > 100_000 {
		p = append(p, fmt.Sprintf("--batch-size must be between 1 and 100000, got %d", c.BatchSize))
	}
	if c.PollInterval <= 0 {
		p = append(p, "--poll-interval must be positive")
	}
	if c.Workers < 1 || c.Workers > 64 {
		p = append(p, fmt.Sprintf("--workers must be between 1 and 64, got %d", c.Workers))
	}
	if c.MaxArgsBytes < 1 {
		p = append(p, "--max-args-bytes must be positive")
	}
	if c.StatsInterval <= 0 {
		p = append(p, "--stats-interval must be positive")
	}
	if c.ListenerCheckInterval <= 0 {
		p = append(p, "--listener-check-interval must be positive")
	}
	if c.ListenDatabaseURL != "" {
		if _, err := pgx.ParseConfig(c.ListenDatabaseURL); err != nil {
			// pgx's error may echo the URL; never print the password.
			p = append(p, "--listen-database-url: cannot parse the connection URL")
		}
		if c.PollOnly {
			p = append(p, "--listen-database-url and --poll-only contradict each other")
		}
	}
	for _, k := range c.AllowedKinds {
		if strings.TrimSpace(k) == "" || len(k) >= 128 {
			p = append(p, fmt.Sprintf("--allowed-kinds: kind %q must be 1 to 127 bytes", k))
		}
	}
	return p
}

// Run implements daemon.Command.
func (c *CLI) Run(ctx context.Context, env *daemon.Env) error {
	m := NewMetrics()
	if err := m.Register(env.Registry); err != nil {
		return fmt.Errorf("enqueuer: register metrics: %w", err)
	}
	pollOnly := c.PollOnly
	var listenConfig *pgx.ConnConfig
	switch {
	case pollOnly:
		env.Logger.Info("polling only (--poll-only): staged jobs wait up to --poll-interval", zap.Duration("poll_interval", c.PollInterval))
	case c.ListenDatabaseURL != "":
		cfg, err := pgx.ParseConfig(c.ListenDatabaseURL)
		if err != nil {
			return &config.Error{Problems: []string{"--listen-database-url: cannot parse the connection URL"}}
		}
		if _, ok := cfg.RuntimeParams["application_name"]; !ok {
			cfg.RuntimeParams["application_name"] = "idemd-enqueuer-listener"
		}
		listenConfig = cfg
	case c.Pooler == config.PoolerTransaction:
		// LISTEN through a transaction-mode pooler lands on a server
		// connection the pooler hands to other clients: it is left there
		// for the API's connections, and nothing is heard.
		pollOnly = true
		env.Logger.Warn("--pooler transaction without --listen-database-url: not listening, staged jobs wait up to --poll-interval; "+
			"give --listen-database-url a direct or session-mode URL for millisecond wake-ups", zap.Duration("poll_interval", c.PollInterval))
	}
	svc, err := New(env.Pool, Config{
		BatchSize:             c.BatchSize,
		Workers:               c.Workers,
		PollInterval:          c.PollInterval,
		AllowedKinds:          c.AllowedKinds,
		MaxArgsBytes:          c.MaxArgsBytes,
		StatsInterval:         c.StatsInterval,
		PollOnly:              pollOnly,
		ListenConfig:          listenConfig,
		ListenerCheckInterval: c.ListenerCheckInterval,
		Logger:                env.Logger,
		Metrics:               m,
		Ready:                 env.Ready,
	})
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	if c.Once {
		start := time.Now()
		res, err := svc.Drain(ctx)
		fields := []zap.Field{zap.Int("moved", res.Moved), zap.Int("dead_lettered", res.DeadLettered),
			zap.Int("batches", res.Batches), zap.Duration("duration", time.Since(start))}
		if err != nil {
			env.Logger.Error("drain failed", append(fields, zap.Error(err))...)
			return daemon.AlreadyLogged(err)
		}
		env.Logger.Info("drained", fields...)
		return nil
	}
	env.Logger.Info("enqueuer started", zap.Int("batch_size", c.BatchSize), zap.Duration("poll_interval", c.PollInterval),
		zap.Int("max_args_bytes", c.MaxArgsBytes))
	if err := daemon.RunService(ctx, svc, c.ShutdownTimeout); err != nil {
		return err
	}
	env.Logger.Info("enqueuer stopped")
	return nil
}

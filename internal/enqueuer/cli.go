package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"time"

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
}

// CommonConfig implements daemon.Command.
func (c *CLI) CommonConfig() *config.Common { return &c.Common }

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
	svc, err := New(env.Pool, Config{
		BatchSize:     c.BatchSize,
		Workers:       c.Workers,
		PollInterval:  c.PollInterval,
		AllowedKinds:  c.AllowedKinds,
		MaxArgsBytes:  c.MaxArgsBytes,
		StatsInterval: c.StatsInterval,
		Logger:        env.Logger,
		Metrics:       m,
		Ready:         env.Ready,
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

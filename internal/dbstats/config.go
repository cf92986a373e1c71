package dbstats

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
)

// Settings are the exporter's knobs, as flags of the command that runs it
// (each with its IDEMD_ variable): the completer embeds them as a named
// field tagged embed:"", and its FlagDefaults includes DefaultSettings.
type Settings struct {
	Interval         time.Duration `name:"db-stats-interval" default:"${db_stats_interval}" help:"How often the replica holding the db-stats lease reads the database-wide gauges (River's jobs by queue and state, the reaper's last complete run, what holds the vacuum horizon back); the others try to take the lease as often."`
	LeaseTTL         time.Duration `name:"db-stats-lease-ttl" default:"${db_stats_lease_ttl}" help:"The db-stats lease expires this long after its holder's last pass: a replica that dies is replaced as exporter within this plus --db-stats-interval. Longer than --db-stats-interval plus --db-stats-statement-timeout."`
	StatementTimeout time.Duration `name:"db-stats-statement-timeout" default:"${db_stats_statement_timeout}" help:"statement_timeout of a pass's queries (SET LOCAL)."`
}

// DefaultSettings returns the settings with every default filled in. It is
// the only place a default is written.
func DefaultSettings() Settings {
	return Settings{
		Interval:         30 * time.Second,
		LeaseTTL:         2 * time.Minute,
		StatementTimeout: 10 * time.Second,
	}
}

// Check returns every problem with the settings, each named by its flag.
func (s *Settings) Check() []string {
	var p []string
	if s.Interval <= 0 {
		p = append(p, "--db-stats-interval must be positive")
	}
	if s.StatementTimeout <= 0 {
		p = append(p, "--db-stats-statement-timeout must be positive")
	}
	// A live holder renews at every pass; a pass takes at most the
	// statement timeout. Anything shorter hands the lease around between
	// live replicas.
	if s.Interval > 0 && s.StatementTimeout > 0 && s.LeaseTTL <= s.Interval+s.StatementTimeout {
		p = append(p, fmt.Sprintf("--db-stats-lease-ttl %s must be longer than --db-stats-interval %s plus --db-stats-statement-timeout %s: the holder renews it once a pass",
			config.FormatDuration(s.LeaseTTL), config.FormatDuration(s.Interval), config.FormatDuration(s.StatementTimeout)))
	}
	return p
}

// Config is what New needs: the settings and the process's shared
// resources.
type Config struct {
	Settings

	Pool *pgxpool.Pool
	// Calls bounds every database call (--database-timeout); nil bounds
	// them by its default and counts nothing.
	Calls    *dbcall.Bounds
	Logger   *zap.Logger
	Registry prometheus.Registerer // nil: the collector is not registered
}

func (c *Config) check() error {
	p := c.Settings.Check()
	if c.Pool == nil {
		p = append(p, "a database pool is required")
	}
	return config.Problems(p)
}

package enqueuer

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/opshttp"
)

// maxBatchSize bounds one move transaction whatever --batch-size says.
const maxBatchSize = 100_000

// maxWorkers bounds the batches one replica moves at once.
const maxWorkers = 64

// A standby's attempts at the drainer lock: no faster than the server can
// shrug off, no slower than the sweep's own scale (with minutes between
// attempts a takeover would wait for minutes while notifications go
// unheard).
const (
	minTakeoverInterval = 5 * time.Millisecond
	maxTakeoverInterval = time.Minute
)

// listenerApplicationName is the listener connection's application_name
// when --listen-database-url names none.
const listenerApplicationName = "idemd-enqueuer-listener"

// Settings are the operator-facing knobs. The command parses them from
// flags (each has an IDEMD_ environment variable through kong's
// DefaultEnvars); their defaults are DefaultSettings. Zero is a value, and
// for every number here but --wake-coalesce and --busy-poll-interval (0:
// off) a refused one: there is no "0 means the default".
type Settings struct {
	BatchSize        int           `name:"batch-size" default:"${batch_size}" help:"Most staged rows moved per transaction."`
	Workers          int           `name:"workers" default:"${workers}" help:"Batches moved at once while draining, each on its own connection."`
	SweepInterval    time.Duration `name:"sweep-interval" default:"${sweep_interval}" help:"How often the sweep looks for staged rows no notification reported (the only wake-up with --poll-only; notifications are the normal wake-up)."`
	AllowedKinds     []string      `name:"allowed-kinds" sep:"," help:"Comma-separated job kinds to accept; others are dead-lettered. Empty accepts any kind."`
	MaxArgsBytes     int           `name:"max-args-bytes" default:"${max_args_bytes}" help:"Dead-letter staged rows whose job_args exceed this many bytes."`
	StatsInterval    time.Duration `name:"stats-interval" default:"${stats_interval}" help:"How often the backlog gauges are refreshed."`
	BusyPollInterval time.Duration `name:"busy-poll-interval" default:"${busy_poll_interval}" help:"Under a stream of commits (20 notifications a second or more) the drainer stops being notified and polls staged_jobs this often instead (backing off to 50ms while polls come back empty), so the API's commits skip their NOTIFY, which would make them wait for one another's WAL flush; it goes back to notifications when the stream ebbs. 0 turns polling off: every commit notifies."`
	WakeCoalesce     time.Duration `name:"wake-coalesce" default:"${wake_coalesce}" help:"Under a stream of commits (50 a second or more), start a pass no sooner than this after the previous one (when it took few rows) or once 4 notifications wait, so one pass moves the rows of several; below that rate a commit is moved at once. 0 turns it off."`

	ListenDatabaseURL     string        `name:"listen-database-url" help:"Connection URL for LISTEN only: a direct or session-mode URL when --database-url goes through a transaction-mode pooler. Empty: the --database-url connection (with --pooler transaction, no listening: wake every --sweep-interval)."`
	PollOnly              bool          `name:"poll-only" help:"Do not LISTEN; wake every --sweep-interval. For setups where no connection can LISTEN."`
	ListenerCheckInterval time.Duration `name:"listener-check-interval" default:"${listener_check_interval}" help:"How often the listener sends itself a NOTIFY through the pool to prove notifications arrive; one that does not come back within --listener-check-timeout marks the listener down and reconnects it."`
	ListenerCheckTimeout  time.Duration `name:"listener-check-timeout" default:"${listener_check_timeout}" help:"How long the listener waits for its own NOTIFY before it counts as deaf and reconnects."`
	TakeoverInterval      time.Duration `name:"takeover-interval" default:"${takeover_interval}" help:"How often a standby replica tries for the drainer lock, with a statement that returns at once (a statement that waited would hold its snapshot and keep vacuum from removing anything in the whole database); the longest a takeover waits after the drainer's session ends."`
}

// DefaultSettings returns the settings with every default filled in, as
// kong would parse an empty command line. It is the only place a default
// is written; the batch size and workers were chosen by the benchmark in
// internal/bench/enqueuer (docs/enqueuer.md).
func DefaultSettings() Settings {
	return Settings{
		BatchSize:     5000,
		Workers:       2,
		SweepInterval: 2 * time.Second,
		MaxArgsBytes:  256 << 10,
		StatsInterval: 5 * time.Second,
		// Wake-up coalescing (coalesce.go): at most this much added
		// commit-to-River latency, and only while commits stream in at
		// 50 a second or more (River's own fetch cooldown is 100 ms);
		// chosen by the load benchmark (docs/benchmarks/load.md).
		WakeCoalesce: 50 * time.Millisecond,
		// Polling under a stream of commits (poll.go): a committed row
		// waits at most this long for the next poll. 3 ms against 5 ms:
		// commit-to-River p99 at 1,000 jobs/s 5.4 against 7.5 ms, for
		// about as many move transactions as the coalesced notifications
		// ran (docs/benchmarks/enqueuer.md).
		BusyPollInterval: 3 * time.Millisecond,
		// The listener's self-check: frequent enough that a deaf listener
		// is found within a scrape or two, rare enough to cost nothing.
		ListenerCheckInterval: 30 * time.Second,
		ListenerCheckTimeout:  5 * time.Second,
		// A standby's attempts at the drainer lock (drainer.go): each is
		// one round trip of tens of microseconds on the server (no xid,
		// no write), so forty a second cost a standby about 0.2 % of a
		// core, and a takeover after a SIGKILL waits 12 ms more on
		// average than a wait in pg_advisory_lock did
		// (docs/benchmarks/enqueuer.md, "Takeover after a SIGKILL").
		TakeoverInterval: 25 * time.Millisecond,
	}
}

// Check returns every problem with the settings, not just the first, each
// named by its flag. It is the enqueuer's only list of rules, for the
// command (exit 2) and New alike. It never prints the listen URL, which
// may hold a password.
func (s *Settings) Check() []string {
	var p []string
	if s.BatchSize < 1 || s.BatchSize > maxBatchSize {
		p = append(p, fmt.Sprintf("--batch-size must be between 1 and %d, got %d", maxBatchSize, s.BatchSize))
	}
	if s.Workers < 1 || s.Workers > maxWorkers {
		p = append(p, fmt.Sprintf("--workers must be between 1 and %d, got %d", maxWorkers, s.Workers))
	}
	pos := func(name string, d time.Duration) {
		if d <= 0 {
			p = append(p, name+" must be positive")
		}
	}
	pos("--sweep-interval", s.SweepInterval)
	if s.MaxArgsBytes < 1 {
		p = append(p, "--max-args-bytes must be positive")
	}
	pos("--stats-interval", s.StatsInterval)
	if s.WakeCoalesce < 0 || s.WakeCoalesce > maxWakeCoalesce {
		p = append(p, fmt.Sprintf("--wake-coalesce must be between 0 and %s, got %s", maxWakeCoalesce, s.WakeCoalesce))
	}
	if s.BusyPollInterval < 0 || s.BusyPollInterval > maxBusyPollInterval {
		p = append(p, fmt.Sprintf("--busy-poll-interval must be between 0 and %s, got %s", maxBusyPollInterval, s.BusyPollInterval))
	}
	pos("--listener-check-interval", s.ListenerCheckInterval)
	pos("--listener-check-timeout", s.ListenerCheckTimeout)
	if s.TakeoverInterval < minTakeoverInterval || s.TakeoverInterval > maxTakeoverInterval {
		p = append(p, fmt.Sprintf("--takeover-interval must be between %s and %s, got %s", minTakeoverInterval, maxTakeoverInterval, s.TakeoverInterval))
	}
	if s.ListenDatabaseURL != "" {
		if _, err := pgx.ParseConfig(s.ListenDatabaseURL); err != nil {
			// pgx's error may echo the URL; never print the password.
			p = append(p, "--listen-database-url: cannot parse the connection URL")
		}
		if s.PollOnly {
			p = append(p, "--listen-database-url and --poll-only contradict each other")
		}
	}
	for _, k := range s.AllowedKinds {
		if strings.TrimSpace(k) == "" || len(k) >= 128 {
			p = append(p, fmt.Sprintf("--allowed-kinds: kind %q must be 1 to 127 bytes", k))
		}
	}
	return p
}

// Config is what New needs: the settings plus what is not a flag.
type Config struct {
	Settings

	Pool *pgxpool.Pool
	// Calls bounds every database call (--database-timeout); nil bounds
	// them by its default and counts nothing.
	Calls *dbcall.Bounds
	// Logger; nil discards.
	Logger   *zap.Logger
	Registry prometheus.Registerer // nil: metrics are not registered
	// Ready, when set, is marked after every committed batch and by a sweep
	// that finds nothing staged, so /readyz reflects a stuck loop; Start
	// sets how old that may be from --sweep-interval.
	Ready *opshttp.Readiness
}

func (c *Config) check() error {
	p := c.Settings.Check()
	if c.Pool == nil {
		p = append(p, "a database pool is required")
	}
	return config.Problems(p)
}

// listenConfig is the listener's connection: --listen-database-url's, with
// an application_name of its own unless the URL sets one and the bounds
// every connection of the pool has (internal/dbcall), or the pool's.
// LISTEN is session state, so it is never a pooled connection. Its
// session sets the server's keepalives itself (drainerSessionSQL): the
// URL may be a session-mode pooler's.
func (c *Config) listenConfig() (*pgx.ConnConfig, error) {
	if c.ListenDatabaseURL == "" {
		return c.Pool.Config().ConnConfig.Copy(), nil
	}
	cfg, err := pgx.ParseConfig(c.ListenDatabaseURL)
	if err != nil {
		return nil, &config.Error{Problems: []string{"--listen-database-url: cannot parse the connection URL"}}
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = listenerApplicationName
	}
	dbcall.Connections(&cfg.Config, c.Calls.Timeout())
	return cfg, nil
}

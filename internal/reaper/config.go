package reaper

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/reaper/throttle"
)

// Rules that are not defaults.
const (
	// MaxConcurrency bounds --concurrency: more batches at once than a
	// database has cores only queue on its locks and its WAL.
	MaxConcurrency = 64
	// MaxBatchSize bounds one transaction's size whatever the flag says.
	MaxBatchSize = 1_000_000
	// minBatchSize is the floor the run shrinks a timing-out batch to.
	minBatchSize = 100
)

// Eligibility is the part of the settings that decides which keys a run may
// delete (sql.go's eligible): the rules `idemctl status` counts with too, so
// it shows an operator what the reaper would do (PlanRun).
type Eligibility struct {
	Retention  time.Duration `name:"retention" default:"${retention}" help:"Delete keys whose created_at is older than this, by the database clock. At least 1h."`
	LockWindow time.Duration `name:"lock-window" default:"${lock_window}" help:"A key whose locked_at is newer than this is in flight and never deleted; an older lock is one a crashed request left behind."`
}

// Check returns every problem with the eligibility settings.
func (e *Eligibility) Check() []string {
	var p []string
	if e.Retention < MinRetention {
		p = append(p, fmt.Sprintf("--retention %s is below the minimum %s: keys that young may still be retried by clients", e.Retention, MinRetention))
	}
	if e.LockWindow <= 0 {
		p = append(p, "--lock-window must be positive")
	}
	return p
}

// Settings are the operator-facing knobs. The command parses them from
// flags (each has an IDEMD_ environment variable through kong's
// DefaultEnvars); every default comes from DefaultSettings.
type Settings struct {
	Eligibility `embed:""`

	Schedule         string           `name:"schedule" default:"${schedule}" help:"Keep running and reap on this schedule: a robfig/cron spec (\"@every 1h\", \"@hourly\", \"15 * * * *\"). Empty: one run and exit."`
	DryRun           bool             `name:"dry-run" default:"${dry_run}" help:"Change nothing: print how many keys would be deleted and which would be flagged for review."`
	BatchSize        int              `name:"batch-size" default:"${batch_size}" help:"Keys deleted per batch; each batch is its own transaction."`
	BatchPause       time.Duration    `name:"batch-pause" default:"${batch_pause}" help:"Pause between batches (between rounds with --concurrency), giving the API's writes room on a busy table."`
	Concurrency      int              `name:"concurrency" default:"${concurrency}" help:"Batches run at once, each in its own transaction on its own pooled connection, on consecutive ranges of keys: up to this many database cores. For catching up on a backlog, or a schema whose foreign keys make each deletion cost more; the pool needs as many connections (pool_max_conns)."`
	StatementTimeout time.Duration    `name:"statement-timeout" default:"${statement_timeout}" help:"statement_timeout of each batch (SET LOCAL). A batch that times out is retried at half the size."`
	MaxRuntime       time.Duration    `name:"max-runtime" default:"${max_runtime}" help:"Stop starting new batches after this long; the next run continues."`
	MaxDeletes       int64            `name:"max-deletes" default:"${max_deletes}" help:"Refuse (exit 1) a run that would delete more keys than this. 0: no cap."`
	MaxFlags         int64            `name:"max-flags" default:"${max_flags}" help:"Refuse (exit 1) a run that would flag more keys for review than this. 0: no cap."`
	FlaggedBy        string           `name:"flagged-by" default:"${flagged_by}" help:"Recorded as flagged_by on the reviews this reaper creates."`
	LeaseTTL         time.Duration    `name:"lease-ttl" default:"${lease_ttl}" help:"A run's lease on the database (it keeps runs from overlapping) expires this long after its last renewal, so a run killed mid-run delays the next by at most this. Longer than --statement-timeout."`
	Throttle         ThrottleSettings `embed:""`
	WALCompression   string           `name:"wal-compression" default:"${wal_compression}" help:"wal_compression of the reaper's batch transactions (SET LOCAL): lz4, zstd, pglz, on, off, or server to keep the server's setting. Needs superuser or GRANT SET ON PARAMETER wal_compression (PostgreSQL 15+); without it the run says so once and keeps the server's setting."`
}

// ThrottleSettings are the throttle's flags (internal/reaper/throttle):
// before every batch the run reads its replicas' lag and the primary's load
// and waits, or stops, when they are over these limits. gh-ost's names.
type ThrottleSettings struct {
	MaxLag         time.Duration `name:"max-lag" default:"${max_lag}" help:"Wait before the next batch while a replica's replay lag is above this (pg_stat_replication's replay_lag on the primary, and each --replica-url). 0: do not watch the replicas' time lag."`
	MaxLagBytes    string        `name:"max-lag-bytes" default:"${max_lag_bytes}" help:"Wait before the next batch while a replica's replay is more than this much WAL behind the primary (64MB, 512kB, bytes): it also sees a replica whose replay has stopped. 0: do not watch the distance."`
	MaxLoad        string        `name:"max-load" default:"${max_load}" help:"Limits on the primary's load, comma-separated: wal_rate=<bytes/s> paces the server's WAL (the reaper's and the API's) to that rate on average, each round followed by the time its WAL takes at the rate; wal_rate=auto is 0.8 of the WAL that makes the server request a checkpoint per checkpoint_timeout (from max_wal_size and checkpoint_completion_target), halved when the server requests one anyway. commit_latency=<duration> is the budget of a probe transaction's COMMIT (what the API's commits wait for): the batch size halves after a round over it and grows after one under it, and no round starts while it is over; commit_latency=auto is 4x the probe's commit measured after the first batch, at least 4ms. Empty: no load limit."`
	CriticalLoad   string        `name:"critical-load" default:"${critical_load}" help:"Stop the run cleanly (stop_reason critical_load, recorded with the measurement) when the primary's load is above this, in --max-load's form; its values must be above --max-load's. The next run continues. Empty: never stop for load."`
	PauseMin       time.Duration `name:"pause-min" default:"${pause_min}" help:"The first wait when a limit is crossed; each further wait of the same stretch doubles, up to --pause-max."`
	PauseMax       time.Duration `name:"pause-max" default:"${pause_max}" help:"The longest wait between two readings of the limits while throttled."`
	ReplicaURLs    []string      `name:"replica-url" sep:"none" help:"A standby to read the replay lag of directly (pg_last_wal_replay_lsn), for replicas the primary cannot report on: cascading standbys. Repeat for several. Its role needs only CONNECT. Without a password in it, it logs in with --database-password-file and --database-user-file."`
	ReplicaURLFile string        `name:"replica-url-file" default:"${replica_url_file}" help:"A file of --replica-url values, one per line (# comments), read at start: keeps passwords out of the process's arguments."`
}

// limits returns the throttle's limits; Check must have passed.
func (t *ThrottleSettings) limits() throttle.Limits {
	l, _ := t.parse()
	return l
}

// parse reads the flags into the throttle's limits, with every problem.
func (t *ThrottleSettings) parse() (throttle.Limits, []string) {
	var p []string
	l := throttle.Limits{MaxLag: t.MaxLag, PauseMin: t.PauseMin, PauseMax: t.PauseMax}
	if t.MaxLagBytes != "0" && strings.TrimSpace(t.MaxLagBytes) != "" {
		b, err := throttle.ParseBytes(t.MaxLagBytes)
		if err != nil {
			p = append(p, fmt.Sprintf("--max-lag-bytes: %v", err))
		}
		l.MaxLagBytes = int64(b)
	}
	var err error
	if l.MaxLoad, err = throttle.ParseLoad(t.MaxLoad); err != nil {
		p = append(p, fmt.Sprintf("--max-load %q: %v", t.MaxLoad, err))
	}
	if l.CriticalLoad, err = throttle.ParseLoad(t.CriticalLoad); err != nil {
		p = append(p, fmt.Sprintf("--critical-load %q: %v", t.CriticalLoad, err))
	}
	for _, u := range t.ReplicaURLs {
		if _, err := pgconn.ParseConfig(u); err != nil {
			// The URL itself may hold a password: say which one by position.
			p = append(p, fmt.Sprintf("--replica-url: a value does not parse as a connection URL (%d characters)", len(u)))
		}
	}
	return l, append(p, l.Check()...)
}

// DefaultSettings returns the settings with every default filled in: the
// one place a default is written (the flags' defaults are read from it).
func DefaultSettings() Settings {
	return Settings{
		Eligibility: Eligibility{
			Retention:  72 * time.Hour,
			LockWindow: time.Hour,
		},
		// From the benchmark in docs/reaper.md: keys/s grew by about 30%
		// from 10k to 30k keys per batch (the fixed cost of a batch, its
		// pause and commit, spread over more keys) and by 2% more at 50k,
		// while each batch's transaction (its row locks, its WAL, the work
		// a failed batch rolls back) keeps growing with the size.
		BatchSize:  30000,
		BatchPause: 10 * time.Millisecond,
		// One batch at a time: a run then uses at most one of the
		// database's cores and leaves the rest to the API. More is for an
		// operator who knows the cores are there (docs/reaper.md).
		Concurrency:      1,
		StatementTimeout: 15 * time.Second,
		MaxRuntime:       time.Hour,
		FlaggedBy:        "reaper",
		// It bounds how long a run killed mid-run keeps the next run
		// waiting; it must outlast a batch (--statement-timeout), which
		// holds the lease row locked while it runs.
		LeaseTTL: time.Minute,
		// Most of a batch's WAL is full-page images of the heap pages it
		// deletes from (the first change to a page after a checkpoint logs
		// the whole page). lz4 cut a million-key run's WAL from 440 to
		// 185-191 MB, at a cost in keys/s within the run-to-run noise
		// (docs/reaper.md): fewer bytes for every WAL flush, every replica
		// and the archive.
		WALCompression: "lz4",
		Throttle:       DefaultThrottle(),
	}
}

// DefaultThrottle is the throttle's defaults (docs/reaper.md, "The
// throttle"): on for replicas, and for load with limits measured on the
// server when a run starts.
func DefaultThrottle() ThrottleSettings {
	return ThrottleSettings{
		// One second: a read replica serving the API's reads shows data at
		// most about a second old because of the reaper, and a failover
		// loses no more than a second of replay to wait for. A healthy
		// streaming standby replays a batch's WAL well within it.
		MaxLag: time.Second,
		// About five default batches of uncompressed WAL (13 MB each, about
		// 6 MB with lz4): a standby further behind than that is not keeping
		// up whatever its replay_lag says, and when its replay has stopped
		// (pg_wal_replay_pause, a conflict with a query) replay_lag stops
		// being updated while the distance keeps growing.
		MaxLagBytes: "64MB",
		// 100 ms, doubling to 5 s: a lag that clears at once costs one
		// short wait, and a replica minutes behind is asked about a dozen
		// times a minute.
		// A first reap on an untuned server must not cost the API: the
		// run's WAL is paced to what lets the checkpoints come on their
		// schedule (a requested checkpoint makes every page the API
		// touches next be logged whole), and the batches shrink to keep
		// the API's commits within a few times their quiet time. Both
		// are measured on the server when the run starts, so neither
		// needs tuning (docs/reaper.md, "The throttle").
		MaxLoad:  "wal_rate=auto,commit_latency=auto",
		PauseMin: 100 * time.Millisecond,
		PauseMax: 5 * time.Second,
	}
}

// walCompressionValues are PostgreSQL's wal_compression values, and server
// (leave the session's setting alone).
var walCompressionValues = []string{"server", "off", "on", "pglz", "lz4", "zstd"}

// cronParser accepts the standard five fields and the descriptors
// (@every 1h, @hourly, ...), the forms operators know from crontab.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Check returns every problem with the settings, not just the first: the
// one list of the reaper's rules, for the command (exit 2) and New alike.
func (s *Settings) Check() []string {
	p := s.Eligibility.Check()
	if s.BatchSize < 1 || s.BatchSize > MaxBatchSize {
		p = append(p, fmt.Sprintf("--batch-size %d must be between 1 and %d", s.BatchSize, MaxBatchSize))
	}
	if s.Concurrency < 1 || s.Concurrency > MaxConcurrency {
		p = append(p, fmt.Sprintf("--concurrency %d must be between 1 and %d", s.Concurrency, MaxConcurrency))
	}
	if s.BatchPause < 0 {
		p = append(p, "--batch-pause must not be negative")
	}
	if s.StatementTimeout <= 0 {
		p = append(p, "--statement-timeout must be positive")
	}
	if s.MaxRuntime <= 0 {
		p = append(p, "--max-runtime must be positive")
	}
	if s.LeaseTTL <= s.StatementTimeout {
		p = append(p, fmt.Sprintf("--lease-ttl %s must be longer than --statement-timeout %s: a batch holds the lease while it runs", s.LeaseTTL, s.StatementTimeout))
	}
	if s.MaxDeletes < 0 {
		p = append(p, "--max-deletes must not be negative (0 means no cap)")
	}
	if s.MaxFlags < 0 {
		p = append(p, "--max-flags must not be negative (0 means no cap)")
	}
	if strings.TrimSpace(s.FlaggedBy) == "" {
		p = append(p, "--flagged-by must not be empty")
	}
	if !slices.Contains(walCompressionValues, s.WALCompression) {
		p = append(p, fmt.Sprintf("--wal-compression %q must be one of %s", s.WALCompression, strings.Join(walCompressionValues, ", ")))
	}
	_, tp := s.Throttle.parse()
	p = append(p, tp...)
	if s.Schedule != "" {
		if _, err := cronParser.Parse(s.Schedule); err != nil {
			p = append(p, fmt.Sprintf("--schedule %q: %v", s.Schedule, err))
		}
		if s.DryRun {
			p = append(p, "--dry-run is a one-off: it cannot be combined with --schedule")
		}
	}
	return p
}

// Config is what New needs: validated settings plus the process's shared
// resources.
type Config struct {
	Settings

	Pool *pgxpool.Pool
	// Calls bounds every database call (--database-timeout); nil bounds
	// them by its default and counts nothing.
	Calls    *dbcall.Bounds
	Logger   *zap.Logger
	Registry prometheus.Registerer // nil: metrics are not registered
	// Ready, when set, is marked after every scheduled run that did its job
	// (or found another run doing it), so /readyz reflects a stuck
	// schedule; Start sets how old that may be from the schedule.
	Ready *opshttp.Readiness
	// Replicas are the standbys of --replica-url, opened by the command
	// (OpenReplicas), read for their lag before every batch.
	Replicas []throttle.Replica
}

func (c *Config) check() error {
	p := c.Settings.Check()
	if c.Pool == nil {
		p = append(p, "a database pool is required")
	} else if conns := c.Pool.Config().MaxConns; int64(conns) < int64(c.Concurrency) {
		// Every batch of a round holds a connection. (The lease's
		// heartbeat waits for the round to end anyway, so it needs none of
		// its own.)
		p = append(p, fmt.Sprintf("--concurrency %d needs a pool of at least %d connections, the pool has %d: add pool_max_conns=%d to the connection URL",
			c.Concurrency, c.Concurrency, conns, c.Concurrency))
	}
	return config.Problems(p)
}

// Package dbstats exports database-wide gauges, by one replica at a time:
// numbers that are the same whichever replica reads them, so every replica
// reading them would only multiply the queries and the series.
//
//   - River's queue depth, which River itself does not export: jobs in
//     river_job by queue and state, and how long the oldest available job of
//     each queue has waited for a worker (idemd_river_jobs,
//     idemd_river_oldest_available_age_seconds).
//   - The reaper's run history's last complete run
//     (idemd_reaper_history_last_success_timestamp_seconds, read through
//     internal/runhistory), whichever process ran it: a CronJob reaper lives
//     too briefly to be scraped, so its health shows here. Absent while the
//     history has no complete run, never 0.
//   - What holds the database's xmin horizon back, so on-call sees a
//     snapshot that keeps VACUUM from removing anything, the API's own
//     included: the oldest session of each application_name, replication
//     slots and prepared transactions, each with its age (horizon.go).
//
// Every replica of the daemon that runs it (the completer) starts an
// exporter, and one of them at a time reads: each pass takes (or renews)
// the db-stats lease in idemd_leases (internal/lease). The holder queries
// and exports; every other replica exports none of these series and
// idemd_dbstats_exporter 0, so Prometheus sees one set of numbers and the
// database answers one pass per interval whatever the replica count. A
// holder that stops releases the lease, and another replica takes it at its
// next pass; one that dies leaves it to expire within --db-stats-lease-ttl.
//
// Only the River states of work not yet done are counted (available,
// pending, retryable, running, scheduled): they are what a queue's depth
// is, and their part of River's index is small. Finalized jobs (completed,
// cancelled, discarded) are history that River's cleaner deletes; counting
// them would read a day of completed jobs every pass.
package dbstats

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/runhistory"
)

// LeaseName is the exporter's row in idemd_leases.
const LeaseName = "db-stats"

// States are the river_job states counted, in the order they are exported.
var States = []string{"available", "pending", "retryable", "running", "scheduled"}

// QueueStats is one queue's part of a pass.
type QueueStats struct {
	Queue string
	// Jobs by state, every state of States present (0 when none).
	Jobs map[string]int64
	// OldestAvailableAge is how long the oldest available job has been due
	// (now minus its scheduled_at); 0 when none is available.
	OldestAvailableAge time.Duration
}

// Result is what one pass did. It is never nil.
type Result struct {
	// Exporting: this replica holds the lease and exports Queues and
	// ReaperLastSuccess.
	Exporting bool
	// Holder is the lease's holder when another replica has it ("" when it
	// is in the middle of a pass and could not be read).
	Holder string
	// TookOverFrom names the holder whose expired lease this pass took.
	TookOverFrom string
	// Queues, sorted by name: every queue with live jobs now or at an
	// earlier pass of this holding.
	Queues []QueueStats
	// ReaperLastSuccess is when the reaper's last complete run ended (the
	// run history's, runhistory.LastSuccess); nil when it has none.
	ReaperLastSuccess *time.Time
	// ReaperThrottled is the share of its time the newest reaper run spent
	// throttled (runhistory.LastThrottledShare); nil when there is none.
	ReaperThrottled *float64
	// Horizon is what holds the database's xmin horizon back; nil when
	// not exporting.
	Horizon  *Horizon
	Duration time.Duration
}

// Service is the exporter.
type Service struct {
	// Skeleton gives the Service its Start (a pass now, then every
	// --db-stats-interval until Stop or ctx ends), Stop (the current pass
	// finishes until ctx's deadline, the lease is released for another
	// replica's next pass; on return nothing of the exporter runs) and
	// RunOnce (one pass: take or renew the lease, read the stats if it is
	// ours).
	lifecycle.Skeleton[*Result]

	cfg     Config
	logger  *zap.Logger
	holder  string
	metrics *metrics

	// pinnedNow replaces the database's now() in the River query; tests
	// use it for exact ages. Production leaves it nil.
	pinnedNow *time.Time

	// Owned by the pass (one at a time): the queues seen since this
	// replica took the lease, kept at 0 once drained.
	known     map[string]bool
	exporting bool
	// hidden: the last pass found the role unable to read other roles'
	// sessions' times (logged once when that starts and when it ends).
	hidden bool
}

// New validates cfg and builds a Service. A bad configuration returns a
// *config.Error listing every problem.
func New(cfg Config) (*Service, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, logger: cfg.Logger.Named("db-stats"),
		holder: lease.Holder(LeaseName), metrics: m,
		known: map[string]bool{},
	}
	s.Skeleton = lifecycle.Skeleton[*Result]{
		Name:   "db-stats",
		Logger: s.logger,
		Pass:   s.pass,
		Next:   func(*Result) time.Duration { return cfg.Interval },
		// A failed pass (the database is unreachable) is retried sooner
		// than the interval, so the gauges come back with the database.
		Retry:         lifecycle.Retry{Base: time.Second, Max: cfg.Interval},
		Finally:       s.release,
		Summary:       "db-stats pass",
		QuietTimeouts: true,
		// The exporter logs when it starts and stops exporting, not
		// every pass: only a failed pass gets a line.
		Summarize: func(last *Result, _ error) ([]zap.Field, bool) {
			return []zap.Field{zap.Bool("exporting", last.Exporting), zap.Duration("duration", last.Duration)}, false
		},
	}
	return s, nil
}

// pass is one pass: the lease, then the stats when it is ours. A pass has
// one unit, so it has no stop to look at.
func (s *Service) pass(ctx context.Context, _ lifecycle.Stop) (*Result, error) {
	start := time.Now()
	res := &Result{}
	err := s.exportPass(ctx, res)
	res.Duration = time.Since(start)
	switch {
	case err != nil:
		s.metrics.passes.WithLabelValues(passError).Inc()
	case res.Exporting:
		s.metrics.passes.WithLabelValues(passExported).Inc()
	default:
		s.metrics.passes.WithLabelValues(passStandby).Inc()
	}
	return res, err
}

func (s *Service) exportPass(ctx context.Context, res *Result) error {
	var a lease.Attempt
	err := s.cfg.Calls.Do(ctx, "db-stats lease: acquire", func(ctx context.Context) (err error) {
		a, err = lease.Acquire(ctx, s.cfg.Pool, LeaseName, s.holder, s.cfg.LeaseTTL)
		return err
	})
	if err != nil {
		s.stopExporting("the db-stats lease could not be renewed", err)
		return fmt.Errorf("db-stats: %w", err)
	}
	if !a.Acquired {
		res.Holder = a.PrevHolder
		s.stopExporting("another replica holds the db-stats lease", nil, zap.String("holder", a.PrevHolder))
		return nil
	}
	if a.TookOver(s.holder) {
		res.TookOverFrom = a.PrevHolder
	}
	rd, err := s.query(ctx)
	if err != nil {
		// Numbers that can no longer be refreshed are not exported.
		s.stopExporting("reading the stats failed", err)
		return err
	}
	if !s.exporting {
		s.logger.Info("this replica took the db-stats lease and exports the database-wide gauges",
			zap.String("previous_holder", a.PrevHolder), zap.Bool("took_over_expired", res.TookOverFrom != ""))
	}
	s.exporting = true
	res.Exporting = true
	res.Queues = buildStats(rd.rows, s.known)
	res.ReaperLastSuccess = rd.lastSuccess
	res.ReaperThrottled = rd.throttled
	res.Horizon = rd.horizon
	for _, q := range res.Queues {
		s.known[q.Queue] = true
	}
	s.noteHidden(!rd.horizon.ReadAllStats)
	s.metrics.set(&snapshot{queues: res.Queues, reaperLastSuccess: rd.lastSuccess, reaperThrottled: rd.throttled, horizon: rd.horizon})
	return nil
}

// noteHidden logs when the exporter starts and stops seeing other roles'
// sessions' times: without them a holder of another role (the API's long
// transaction) is exported by its age in transactions only, and the alert
// on its age in time is blind to it.
func (s *Service) noteHidden(hidden bool) {
	switch {
	case hidden && !s.hidden:
		s.logger.Warn("the database role may not read other roles' sessions' times in pg_stat_activity: what holds the xmin horizon is exported by its age in transactions only; GRANT pg_read_all_stats TO the role (deploy/sql/roles.sql does)")
	case !hidden && s.hidden:
		s.logger.Info("the database role reads every session's times in pg_stat_activity again: the xmin horizon's holders are exported with their age in seconds")
	}
	s.hidden = hidden
}

// stopExporting drops the exported numbers (and forgets the queues) when
// this replica stops being the exporter, logging why once.
func (s *Service) stopExporting(why string, err error, fields ...zap.Field) {
	s.metrics.set(nil)
	clear(s.known)
	// The next holding logs the role's view afresh.
	s.hidden = false
	if s.exporting {
		if err != nil {
			fields = append(fields, zap.Error(err))
		}
		s.logger.Info("this replica stopped exporting the database-wide gauges: "+why, fields...)
	}
	s.exporting = false
}

// statsRow is one row of riverdb.LiveJobsSQL.
type statsRow struct {
	Queue, State string
	Count        int64
	OldestSecs   float64
}

// reading is what a pass's transaction read.
type reading struct {
	rows        []statsRow
	lastSuccess *time.Time
	throttled   *float64
	horizon     *Horizon
}

// query reads a pass's stats in one transaction, one call bounded by
// --db-stats-statement-timeout and --database-timeout: River's jobs, the
// reaper's last complete run and the xmin horizon's holders.
func (s *Service) query(ctx context.Context) (*reading, error) {
	var rd reading
	err := s.cfg.Calls.DoStatement(ctx, "db-stats query", s.cfg.StatementTimeout, func(ctx context.Context) error {
		rd = reading{}
		return s.queryTx(ctx, &rd)
	})
	if err != nil {
		return nil, fmt.Errorf("db-stats: %w", err)
	}
	return &rd, nil
}

func (s *Service) queryTx(ctx context.Context, rd *reading) error {
	return pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		// Local to the transaction, so nothing outlives it on a pooled
		// server connection.
		if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true)", fmt.Sprint(s.cfg.StatementTimeout.Milliseconds())); err != nil {
			return err
		}
		r, err := tx.Query(ctx, riverdb.LiveJobsSQL, pgx.NamedArgs{"now": s.pinnedNow})
		if err != nil {
			return fmt.Errorf("count river_job: %w", err)
		}
		if rd.rows, err = pgx.CollectRows(r, pgx.RowToStructByPos[statsRow]); err != nil {
			return fmt.Errorf("count river_job: %w", err)
		}
		if rd.lastSuccess, err = runhistory.LastSuccess(ctx, tx); err != nil {
			return err
		}
		if rd.throttled, err = runhistory.LastThrottledShare(ctx, tx); err != nil {
			return err
		}
		rd.horizon, err = readHorizon(ctx, tx)
		return err
	})
}

// Querier is what CountJobs reads through: a pool, a connection or a
// transaction (idemctl status reads in one read-only snapshot).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// CountJobs counts River's live jobs by state, all queues together, with
// the exporter's own query: idemctl status and the console show the
// numbers idemd_river_jobs exports. A state without jobs is absent.
func CountJobs(ctx context.Context, q Querier) (map[string]int64, error) {
	r, err := q.Query(ctx, riverdb.LiveJobsSQL, pgx.NamedArgs{"now": nil})
	if err != nil {
		return nil, fmt.Errorf("count river_job: %w", err)
	}
	rows, err := pgx.CollectRows(r, pgx.RowToStructByPos[statsRow])
	if err != nil {
		return nil, fmt.Errorf("count river_job: %w", err)
	}
	counts := map[string]int64{}
	for _, row := range rows {
		counts[row.State] += row.Count
	}
	return counts, nil
}

// buildStats turns the query's rows into one QueueStats per queue: every
// queue in rows or in known (seen earlier, now drained: all 0), every state
// of States, and the oldest available job's age. Pure, so the rule is
// tested without a database.
func buildStats(rows []statsRow, known map[string]bool) []QueueStats {
	byQueue := map[string]*QueueStats{}
	get := func(q string) *QueueStats {
		if byQueue[q] == nil {
			jobs := make(map[string]int64, len(States))
			for _, st := range States {
				jobs[st] = 0
			}
			byQueue[q] = &QueueStats{Queue: q, Jobs: jobs}
		}
		return byQueue[q]
	}
	for q := range known {
		get(q)
	}
	for _, r := range rows {
		qs := get(r.Queue)
		if _, ok := qs.Jobs[r.State]; !ok {
			continue // a state this version does not count
		}
		qs.Jobs[r.State] += r.Count
		if r.State == "available" && r.Count > 0 {
			qs.OldestAvailableAge = max(0, time.Duration(r.OldestSecs*float64(time.Second)))
		}
	}
	out := make([]QueueStats, 0, len(byQueue))
	for _, q := range slices.Sorted(maps.Keys(byQueue)) {
		out = append(out, *byQueue[q])
	}
	return out
}

// release gives the lease up so another replica takes over at its next
// pass instead of after the TTL. On a fresh context: the work's may be
// cancelled. Failing, the lease expires by itself.
func (s *Service) release(ctx context.Context) {
	s.stopExporting("stopping", nil)
	err := s.cfg.Calls.Do(context.WithoutCancel(ctx), "db-stats lease: release", func(ctx context.Context) error {
		_, err := lease.Release(ctx, s.cfg.Pool, LeaseName, s.holder)
		return err
	})
	if err != nil {
		s.logger.Warn("releasing the db-stats lease failed; it expires by itself",
			zap.Duration("lease_ttl", s.cfg.LeaseTTL), zap.Error(err))
	}
}

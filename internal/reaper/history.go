package reaper

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"idemd/internal/lease"
)

// The run history, idemd_reaper_runs (migrations/00016): one row per run
// that is not a dry run, whatever mode it ran in.

// Modes of a run, the history's mode column.
const (
	ModeOnce     = "once"     // one run and exit: a CronJob or a manual run
	ModeSchedule = "schedule" // a run of a --schedule reaper
)

// Results a run in the history can have: its outcome (complete, incomplete,
// lock_held, error), or for a run whose end is not recorded, whether it is
// still going.
const (
	ResultComplete   = outcomeComplete
	ResultIncomplete = outcomeIncomplete
	ResultLockHeld   = outcomeLockHeld
	ResultError      = outcomeError
	// ResultRunning: no end yet, and its holder still holds the lease.
	ResultRunning = "running"
	// ResultInterrupted: no end, and its holder no longer holds the lease:
	// the run was killed (or lost the database at its end).
	ResultInterrupted = "interrupted"
)

// The history keeps the newest historyKeep runs of the last historyMaxAge.
const (
	historyKeep   = 1000
	historyMaxAge = 30 * 24 * time.Hour
)

// Run is one run of the history.
type Run struct {
	ID         int64      `json:"id"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Mode       string     `json:"mode"`
	Result     string     `json:"result"`
	// Deleted and Flagged count the run's committed batches, also for a run
	// that was interrupted.
	Deleted int64  `json:"deleted"`
	Flagged int64  `json:"flagged"`
	Error   string `json:"error,omitempty"`
	// Holder is the process that ran it, as in the lease table.
	Holder string `json:"holder"`
}

// lastRunsSQL lists the newest runs. A run without an end is running while
// its holder holds a live lease and has begun no later run; otherwise it
// was interrupted.
const lastRunsSQL = `
SELECT r.id, r.started_at, r.finished_at, r.mode,
       COALESCE(r.result, CASE WHEN EXISTS (
                SELECT 1 FROM idemd_leases l
                WHERE l.name = @lease AND l.holder = r.holder AND l.expires_at > clock_timestamp())
            AND NOT EXISTS (SELECT 1 FROM idemd_reaper_runs n WHERE n.holder = r.holder AND n.id > r.id)
            THEN '` + ResultRunning + `' ELSE '` + ResultInterrupted + `' END),
       r.deleted, r.flagged, COALESCE(r.error, ''), r.holder
FROM idemd_reaper_runs r
ORDER BY r.id DESC
LIMIT @n`

// LastRuns returns the newest n runs of the history, newest first.
func LastRuns(ctx context.Context, db Querier, n int) ([]Run, error) {
	rows, err := db.Query(ctx, lastRunsSQL, pgx.NamedArgs{"lease": LeaseName, "n": n})
	if err != nil {
		return nil, fmt.Errorf("reaper: last runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) {
		var run Run
		err := r.Scan(&run.ID, &run.StartedAt, &run.FinishedAt, &run.Mode, &run.Result, &run.Deleted, &run.Flagged, &run.Error, &run.Holder)
		return run, err
	})
	if err != nil {
		return nil, fmt.Errorf("reaper: last runs: %w", err)
	}
	if runs == nil {
		runs = []Run{}
	}
	return runs, nil
}

// LastSuccess returns when the last complete run ended, by the database
// clock, whatever process ran it; nil when the history has none. A
// long-running daemon can export it, so the health of a CronJob reaper,
// which lives too briefly to be scraped, is visible in its metrics.
func LastSuccess(ctx context.Context, db Querier) (*time.Time, error) {
	var t *time.Time
	err := db.QueryRow(ctx, `SELECT max(finished_at) FROM idemd_reaper_runs WHERE result = @result`,
		pgx.NamedArgs{"result": ResultComplete}).Scan(&t)
	if err != nil {
		return nil, fmt.Errorf("reaper: last success: %w", err)
	}
	return t, nil
}

// startRunSQL records a run that took the lease. @elapsed is how long ago
// it started (it may have waited for the lease), so started_at is on the
// database clock like the rest of the row.
const startRunSQL = `
INSERT INTO idemd_reaper_runs (started_at, mode, holder)
VALUES (clock_timestamp() - @elapsed::interval, @mode, @holder)
RETURNING id`

// mode is the history's mode of the service's runs.
func (s *Service) mode() string {
	if s.cfg.Schedule != "" {
		return ModeSchedule
	}
	return ModeOnce
}

// startRun records the start of a run that holds the lease. Even when the
// run is being stopped: its end will be recorded too.
func (s *Service) startRun(ctx context.Context, start time.Time) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var id int64
	err := s.cfg.Pool.QueryRow(ctx, startRunSQL, pgx.NamedArgs{"elapsed": time.Since(start), "mode": s.mode(), "holder": s.holder}).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("reaper: record the run's start in idemd_reaper_runs: %w", err)
	}
	return id, nil
}

// recordBatch adds a batch's counts to its run's row, in the batch's
// transaction: a run killed later still shows what it committed.
func recordBatch(ctx context.Context, tx pgx.Tx, run int64, b batchResult) error {
	_, err := tx.Exec(ctx, `UPDATE idemd_reaper_runs SET deleted = deleted + @deleted, flagged = flagged + @flagged WHERE id = @run`,
		pgx.NamedArgs{"run": run, "deleted": b.deleted, "flagged": b.flagged()})
	if err != nil {
		return fmt.Errorf("record the batch in idemd_reaper_runs: %w", err)
	}
	return nil
}

// endRunSQL records a run's end.
const endRunSQL = `
UPDATE idemd_reaper_runs
SET finished_at = clock_timestamp(), result = @result, deleted = @deleted, flagged = @flagged, error = @error
WHERE id = @run`

// pruneRunsSQL keeps the history bounded: the newest @keep runs of the
// last @max_age.
const pruneRunsSQL = `
DELETE FROM idemd_reaper_runs
WHERE started_at < clock_timestamp() - @max_age::interval
   OR id <= (SELECT id FROM idemd_reaper_runs ORDER BY id DESC OFFSET @keep LIMIT 1)`

// endRun ends a run that held the lease: in one transaction it records the
// run's end, releases the lease and prunes the history, so a row without an
// end always belongs to a run that did not release its lease. On a fresh
// context: the run's may be cancelled. If it fails, the lease expires by
// itself within --lease-ttl (the next run waits that long) and the row
// reads as interrupted.
func (s *Service) endRun(ctx context.Context, run int64, res *Result, runErr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	released := false
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		if run != 0 {
			if _, err := tx.Exec(ctx, endRunSQL, endArgs(run, res, runErr)); err != nil {
				return fmt.Errorf("record the run's end in idemd_reaper_runs: %w", err)
			}
			if _, err := tx.Exec(ctx, pruneRunsSQL, pgx.NamedArgs{"max_age": historyMaxAge, "keep": historyKeep}); err != nil {
				return fmt.Errorf("prune idemd_reaper_runs: %w", err)
			}
		}
		var err error
		released, err = lease.Release(ctx, tx, LeaseName, s.holder)
		return err
	})
	switch {
	case err != nil:
		s.logger.Warn("ending the reaper's run failed; its lease expires by itself and the run history shows it as interrupted",
			zap.Duration("lease_ttl", s.cfg.LeaseTTL), zap.Error(err))
	case !released:
		s.logger.Warn("the reaper's lease was no longer this run's at its end (it stalled past --lease-ttl)",
			zap.Duration("lease_ttl", s.cfg.LeaseTTL))
	}
}

// recordUnleasedRun records a run that never held the lease (another run
// held it, or the run failed before it had it) as one finished row.
func (s *Service) recordUnleasedRun(ctx context.Context, start time.Time, res *Result, runErr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	args := endArgs(0, res, runErr)
	args["elapsed"], args["mode"], args["holder"] = time.Since(start), s.mode(), s.holder
	_, err := s.cfg.Pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder)
VALUES (clock_timestamp() - @elapsed::interval, clock_timestamp(), @mode, @result, @deleted, @flagged, @error, @holder)`, args)
	if err != nil {
		s.logger.Warn("recording the run in idemd_reaper_runs failed", zap.Error(err))
	}
}

// endArgs are a run's end as the history records it.
func endArgs(run int64, res *Result, runErr error) pgx.NamedArgs {
	var msg *string
	if runErr != nil {
		m := runErr.Error()
		msg = &m
	}
	return pgx.NamedArgs{"run": run, "result": outcome(res, runErr), "deleted": res.Deleted, "flagged": res.Flagged, "error": msg}
}

// refreshLastSuccess exports the history's last success
// (idemd_reaper_history_last_success_timestamp_seconds).
func (s *Service) refreshLastSuccess(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, err := LastSuccess(ctx, s.cfg.Pool)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.logger.Warn("reading the reaper's last success from idemd_reaper_runs failed", zap.Error(err))
		}
	case t != nil:
		s.metrics.historyLastSuccess.Set(float64(t.UnixNano()) / 1e9)
	}
}

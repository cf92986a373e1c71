package reaper

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/runhistory"
)

// A run's record in the run history, idemd_reaper_runs, written through
// internal/runhistory (the table's one owner): every run that is not a dry
// run, whatever mode it ran in.

// mode is the history's mode of the service's runs.
func (s *Service) mode() string {
	if s.cfg.Schedule != "" {
		return runhistory.ModeSchedule
	}
	return runhistory.ModeOnce
}

// startRun records the start of a run that holds the lease, with the
// retention and lock window it deletes by (what idemctl status and the
// console count keys past retention with). Even when the run is being
// stopped: its end will be recorded too.
func (s *Service) startRun(ctx context.Context, start time.Time) (int64, error) {
	var id int64
	err := s.cfg.Calls.Do(context.WithoutCancel(ctx), historyOp, func(ctx context.Context) (err error) {
		id, err = runhistory.Start(ctx, s.cfg.Pool, time.Since(start), s.mode(), s.holder,
			runhistory.Settings{Retention: s.cfg.Retention, LockWindow: s.cfg.LockWindow})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reaper: %w", err)
	}
	return id, nil
}

// historyOp names the run history's writes when they run out of their
// bound. They run on a context without the run's end (a run being stopped
// is still recorded), each one call bounded by --database-timeout.
const historyOp = "reaper history"

// recordBatch adds a batch's counts to its run's row, in the batch's
// transaction: a run killed later still shows what it committed.
func recordBatch(ctx context.Context, tx pgx.Tx, run int64, b batchResult) error {
	return runhistory.RecordBatch(ctx, tx, run, b.deleted, b.flagged())
}

// endRun ends a run that held the lease: in one transaction it records the
// run's end, releases the lease and prunes the history, so a row without an
// end always belongs to a run that did not release its lease. On a fresh
// context: the run's may be cancelled. If it fails, the lease expires by
// itself within --lease-ttl (the next run waits that long) and the row
// reads as interrupted.
func (s *Service) endRun(ctx context.Context, run int64, res *Result, runErr error) {
	released := false
	err := s.cfg.Calls.Do(context.WithoutCancel(ctx), historyOp, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
			if run != 0 {
				if err := runhistory.End(ctx, tx, run, runOutcome(res, runErr)); err != nil {
					return err
				}
			}
			var err error
			released, err = lease.Release(ctx, tx, LeaseName, s.holder)
			return err
		})
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
	err := s.cfg.Calls.Do(context.WithoutCancel(ctx), historyOp, func(ctx context.Context) error {
		return runhistory.RecordUnleased(ctx, s.cfg.Pool, time.Since(start), s.mode(), s.holder, runOutcome(res, runErr))
	})
	if err != nil {
		s.logger.Warn("recording the run in idemd_reaper_runs failed", zap.Error(err))
	}
}

// runOutcome is a run's end as the history records it.
func runOutcome(res *Result, runErr error) runhistory.Outcome {
	return runhistory.Outcome{Result: runResult(res, runErr), Deleted: res.Deleted, Flagged: res.Flagged, Err: runErr,
		StopReason: res.StopReason, StopDetail: res.StopDetail}
}

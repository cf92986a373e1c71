package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/robfig/cron/v3"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lifecycle"
)

// Start runs the reaper on --schedule until Stop or until ctx ends (both
// ask the run in progress to stop after its current batch). A run is due
// at each time of the schedule; a run still going at the next time makes
// that time be skipped, and a failed run waits for the next time like any
// other: the schedule, never a retry loop, decides when the next run is.
// Across processes the lease keeps runs from overlapping.
func (s *Service) Start(ctx context.Context) error {
	if s.schedule == nil {
		return errors.New("reaper: Start needs --schedule; use RunOnce for a single run")
	}
	if s.cfg.Ready != nil {
		s.cfg.Ready.MaxPassAge = maxPassAge(s.schedule, time.Now(), s.cfg.MaxRuntime)
	}
	err := s.runner.Start(ctx, func(work context.Context, stop <-chan struct{}) {
		loop := lifecycle.Loop{
			// As cron did: the first run is at the schedule's first time,
			// not when the process starts, so a restart does not reap
			// off-schedule.
			First: time.Until(s.schedule.Next(time.Now())),
			Pass: func(ctx context.Context) error {
				res, err := s.pass(ctx, stop)
				s.signals.passed.Signal(res)
				return err // the run logged it in its summary
			},
			Next: func(error, int) time.Duration {
				d := time.Until(s.schedule.Next(time.Now()))
				s.signals.next.Signal(d)
				return d
			},
		}
		if s.cfg.Ready != nil {
			loop.Passed = s.cfg.Ready.MarkPass
		}
		loop.Run(work, stop)
	})
	if err != nil {
		return err
	}
	s.logger.Info("reaper scheduled", zap.String("schedule", s.cfg.Schedule))
	return nil
}

// Stop asks the run in progress to stop after its current batch, waits for
// it until ctx ends, then cuts the batch (it rolls back) and waits for the
// run to end. When Stop returns, no run of this process is going on and its
// lease is released.
func (s *Service) Stop(ctx context.Context) error {
	return s.runner.Stop(ctx)
}

// maxPassAge is how old the last successful run may be before /readyz
// fails: two intervals of the schedule (one run may find the lease held)
// plus the longest a run may take.
func maxPassAge(sched cron.Schedule, now time.Time, maxRuntime time.Duration) time.Duration {
	next := sched.Next(now)
	return 2*sched.Next(next).Sub(next) + maxRuntime
}

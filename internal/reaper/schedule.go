package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/robfig/cron/v3"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lifecycle"
)

// skeleton is the reaper's part of the services' skeleton. A run is due
// at each time of the schedule, the first one included (a restart does
// not reap off-schedule); a run still going at the next time makes that
// time be skipped, and a failed run waits for the next time like any
// other: the schedule, never a retry, decides when the next run is.
// Across processes the lease keeps runs from overlapping.
func (s *Service) skeleton() lifecycle.Skeleton[*Result] {
	untilNext := func() time.Duration { return time.Until(s.schedule.Next(time.Now())) }
	return lifecycle.Skeleton[*Result]{
		Name:       "reaper",
		Logger:     s.logger,
		Ready:      s.cfg.Ready,
		MaxPassAge: func() time.Duration { return maxPassAge(s.schedule, time.Now(), s.cfg.MaxRuntime) },
		Pass: func(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
			res, err := s.pass(ctx, stop)
			s.signals.passed.Signal(res)
			return res, err
		},
		First: untilNext,
		Next: func(*Result) time.Duration {
			d := untilNext()
			s.signals.next.Signal(d)
			return d
		},
		Summary:      "reaper run summary",
		SummaryLevel: zap.InfoLevel,
		Summarize:    s.summarize,
	}
}

// Start runs the reaper on --schedule until Stop or until ctx ends (both
// ask the run in progress to stop after its current batch).
func (s *Service) Start(ctx context.Context) error {
	if s.schedule == nil {
		return errors.New("reaper: Start needs --schedule; use RunOnce for a single run")
	}
	if err := s.skel.Start(ctx); err != nil {
		return err
	}
	s.logger.Info("reaper scheduled", zap.String("schedule", s.cfg.Schedule))
	return nil
}

// Stop asks the run in progress to stop after its current batch, waits for
// it until ctx ends, then cuts the batch (it rolls back) and waits for the
// run to end. When Stop returns, no run of this process is going on and its
// lease is released.
func (s *Service) Stop(ctx context.Context) error { return s.skel.Stop(ctx) }

// maxPassAge is how old the last successful run may be before /readyz
// fails: two intervals of the schedule (one run may find the lease held)
// plus the longest a run may take.
func maxPassAge(sched cron.Schedule, now time.Time, maxRuntime time.Duration) time.Duration {
	next := sched.Next(now)
	return 2*sched.Next(next).Sub(next) + maxRuntime
}

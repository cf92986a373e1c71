package reaper

import (
	"context"
	"errors"
	"fmt"

	"github.com/robfig/cron/v3"
	"go.uber.org/zap"
)

// Start begins running on --schedule until Stop or until ctx is cancelled.
// Within the process, a run still going when the next is due is skipped
// (cron.SkipIfStillRunning); across processes the advisory lock does the
// same.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("reaper: already started")
	}
	if s.cfg.Schedule == "" {
		return errors.New("reaper: Start needs --schedule; use RunOnce for a single run")
	}
	sched, err := cronParser.Parse(s.cfg.Schedule)
	if err != nil {
		return fmt.Errorf("reaper: parse schedule: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	c := cron.New(
		cron.WithParser(cronParser),
		cron.WithChain(cron.SkipIfStillRunning(cronLogger{s.logger})),
	)
	c.Schedule(sched, cron.FuncJob(func() {
		// The run logs its own summary and error; the schedule goes on.
		_, _ = s.runOnce(runCtx)
	}))
	c.Start()
	s.cron, s.cancel, s.started = c, cancel, true
	s.logger.Info("reaper scheduled", zap.String("schedule", s.cfg.Schedule))
	return nil
}

// Stop stops scheduling and waits, within ctx, for a running run to finish
// its current batch.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	c, cancel, started := s.cron, s.cancel, s.started
	s.started = false
	s.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	done := c.Stop()
	select {
	case <-done.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reaper: stop: %w", ctx.Err())
	}
}

// cronLogger routes robfig/cron's messages to zap.
type cronLogger struct{ l *zap.Logger }

func (c cronLogger) Info(msg string, kv ...any) {
	c.l.Debug("cron: "+msg, zap.Any("details", kv))
}

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("cron: "+msg, zap.Error(err), zap.Any("details", kv))
}

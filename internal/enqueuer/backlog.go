package enqueuer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lifecycle"
)

// Querier is what Backlog reads through: a pool, a connection or a
// transaction (idemctl status reads in one snapshot).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// StagedBacklog is the enqueuer's backlog: the rows of staged_jobs not yet
// moved into River.
type StagedBacklog struct {
	Jobs int64
	// Oldest is the created_at of the oldest staged row (nil: none staged),
	// OldestAge its age by the database clock (0: none staged).
	Oldest    *time.Time
	OldestAge time.Duration
}

// Backlog counts the staged rows and finds the oldest. It is the one
// definition of the enqueuer's backlog: the idemd_enqueuer_backlog_jobs and
// idemd_enqueuer_oldest_staged_age_seconds gauges and idemctl status both
// read it. It reads the whole table (the gauges read from the sweep's
// low-water mark instead).
func Backlog(ctx context.Context, q Querier) (*StagedBacklog, error) {
	return backlog(ctx, q, fullPass)
}

// backlog is Backlog of the rows with id >= from: none below it is staged.
func backlog(ctx context.Context, q Querier, from int64) (*StagedBacklog, error) {
	var b StagedBacklog
	var age float64
	if err := q.QueryRow(ctx, backlogSQL, pgx.NamedArgs{"from": from}).Scan(&b.Jobs, &b.Oldest, &age); err != nil {
		return nil, fmt.Errorf("enqueuer backlog: %w", err)
	}
	b.OldestAge = time.Duration(age * float64(time.Second))
	return &b, nil
}

// statsLoop refreshes the backlog gauges. count(*) is exact and cheap at the
// backlogs this table should ever have; it is read through the primary key
// from the sweep's low-water mark, so it does not walk the dead rows an old
// snapshot keeps below it.
func (s *Service) statsLoop() lifecycle.Loop {
	return lifecycle.Loop{
		Pass: func(ctx context.Context) error {
			err := s.refreshStats(ctx)
			if err != nil && ctx.Err() == nil {
				s.logger.Debug("backlog stats failed", zap.Error(err))
			}
			return err
		},
		Next: func() time.Duration { return s.cfg.StatsInterval },
	}
}

func (s *Service) refreshStats(ctx context.Context) error {
	var b *StagedBacklog
	err := s.calls.Do(ctx, "enqueuer stats", func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: beginSQL}, func(tx pgx.Tx) error {
			var err error
			b, err = backlog(ctx, tx, s.lw.mark.Load())
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("enqueuer stats: %w", err)
	}
	s.metrics.backlog.Set(float64(b.Jobs))
	s.metrics.oldestAge.Set(b.OldestAge.Seconds())
	return nil
}

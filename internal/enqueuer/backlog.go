package enqueuer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// statsLoop refreshes the backlog gauges. count(*) is exact and cheap at the
// backlogs this table should ever have; both it and the oldest row are
// read through the primary key from the sweep's low-water mark, so neither
// walks the dead rows an old snapshot keeps below it.
func (s *Service) statsLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		if err := s.refreshStats(ctx); err != nil && ctx.Err() == nil {
			s.logger.Debug("backlog stats failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Service) refreshStats(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	var age *float64
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: beginSQL}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, statsSQL, pgx.NamedArgs{"from": s.lw.mark.Load()}).Scan(&n, &age)
	})
	if err != nil {
		return fmt.Errorf("enqueuer stats: %w", err)
	}
	s.metrics.backlog.Set(float64(n))
	if age != nil {
		s.metrics.oldestAge.Set(*age)
	} else {
		s.metrics.oldestAge.Set(0)
	}
	return nil
}

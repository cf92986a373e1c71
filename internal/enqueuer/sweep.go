package enqueuer

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The sweep, every PollInterval, finds the lowest committed staged id with
// a plain read (no lock taken, rows other transactions hold locked
// included) and has the loop drain from there (floor.go). It is the poll of
// --poll-only and the safety net under notifications.
//
// A read from the start of staged_jobs_pkey walks every dead entry an old
// snapshot keeps, so the sweep starts at a low-water mark, an id below
// which no staged row can exist now or appear later: floor.go says how it
// is established and moved (nextLowWater); this file reads what it needs.

// lowWater is the sweep's state.
type lowWater struct {
	// mark is state.mark, published for the stats loop.
	mark  atomic.Int64
	state lowWaterState // only the sweep reads and writes it
	count int           // sweeps so far
}

// sweepLoop runs the sweep every PollInterval until ctx ends.
func (s *Service) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			s.logger.Debug("sweep failed", zap.Error(err))
		}
	}
}

// sweep finds the lowest committed staged id and has the loop drain from
// there. A table found empty counts as a pass for /readyz: with nothing
// staged there is nothing to drain.
func (s *Service) sweep(ctx context.Context) error {
	listening := s.listening.Load() && !s.cfg.PollOnly
	start := time.Now()
	low, err := s.sweepOnce(ctx)
	defer s.signals.swept.Signal(listening)
	s.metrics.sweepDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	if low == nil {
		s.markReady(time.Now())
		return nil
	}
	s.floor.lowerSwept(*low, listening)
	s.signal(wakePoll)
	return nil
}

// sweepOnce runs one sweep's statements, in this order, each with its own
// snapshot (READ COMMITTED): the sequence, the lock holders, the read of
// the lowest id. It moves the low-water mark (nextLowWater) and returns
// the lowest id (nil: none).
func (s *Service) sweepOnce(ctx context.Context) (*int64, error) {
	lw := &s.lw
	lw.count++
	full := lw.count%sweepFullEvery == 0
	// The mark's statements and the read run in one transaction begun as a
	// move transaction is, so the read walks the index from the mark
	// whatever the planner thinks of the table (see beginSQL).
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		return nil, fmt.Errorf("enqueuer sweep: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only

	var (
		seq    seqReading
		seqOID *uint32
		last   *int64
		cache  *int64
	)
	err = tx.QueryRow(ctx, sweepSeqSQL).Scan(&seqOID, &last, &cache)
	switch {
	case err == pgx.ErrNoRows:
	case err != nil:
		return nil, fmt.Errorf("enqueuer sweep: sequence: %w", err)
	default:
		seq.usable = cache != nil && *cache == 1
	}
	if seq.usable {
		if last != nil {
			seq.last = *last
		}
		if err := tx.QueryRow(ctx, sweepHoldersSQL, pgx.NamedArgs{"seq": *seqOID}).Scan(&seq.holders); err != nil {
			return nil, fmt.Errorf("enqueuer sweep: sequence locks: %w", err)
		}
	}
	next, low, err := nextLowWater(lw.state, seq, full, func(from int64) (*int64, error) {
		var low *int64
		err := tx.QueryRow(ctx, sweepSQL, pgx.NamedArgs{"from": from}).Scan(&low)
		return low, err
	})
	lw.state = next
	lw.mark.Store(next.mark)
	if err != nil {
		return nil, fmt.Errorf("enqueuer sweep: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueuer sweep: commit: %w", err)
	}
	return low, nil
}

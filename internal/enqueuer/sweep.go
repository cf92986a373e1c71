package enqueuer

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lowwater"
)

// The sweep, every SweepInterval, finds the lowest committed staged id with
// a plain read (no lock taken, rows other transactions hold locked
// included) and has the loop drain from there (floor.go). It is the poll of
// --poll-only and the safety net under notifications.
//
// A read from the start of staged_jobs_pkey walks every dead entry an old
// snapshot keeps, so the sweep starts at a low-water mark, an id below
// which no staged row can exist now or appear later: floor.go says how it
// is established and moved (nextMark); this file reads what it needs.

// lowWater is the sweep's state.
type lowWater struct {
	// mark is state.mark, published for the stats loop.
	mark  atomic.Int64
	state markState // only the sweep reads and writes it
	// reads counts the regular sweeps (those SweepInterval apart), which
	// decide the full ones.
	reads lowwater.Reads
}

// sweepLoop runs the sweep every SweepInterval, and every
// pollingSweepInterval while the drainer polls or would poll but has no
// low-water mark yet (poll.go: each poll drains from the mark, so the mark
// must follow the moves closely). Only the sweeps SweepInterval apart count
// towards the full ones.
func (s *Service) sweepLoop() lifecycle.Loop {
	lastRegular := time.Now()
	return lifecycle.Loop{
		First: s.cfg.SweepInterval,
		Pass: func(ctx context.Context) error {
			regular := time.Since(lastRegular) >= s.cfg.SweepInterval
			if regular {
				lastRegular = time.Now()
			}
			err := s.sweep(ctx, regular)
			if err != nil && ctx.Err() == nil {
				s.logger.Debug("sweep failed", zap.Error(err))
			}
			return err
		},
		Next: func() time.Duration {
			if s.polling.Load() || s.markWanted.Load() && s.lw.mark.Load() == fullPass {
				// Polling, or the drainer would poll but has no mark yet
				// (it takes two sweeps).
				return min(s.cfg.SweepInterval, pollingSweepInterval)
			}
			return s.cfg.SweepInterval
		},
	}
}

// sweep finds the lowest committed staged id and has the loop drain from
// there. A table found empty counts as a pass for /readyz: with nothing
// staged there is nothing to drain. Rows it finds count as notification
// gaps only when notifications were expected to report them: the listener
// up and the drainer not polling.
func (s *Service) sweep(ctx context.Context, regular bool) error {
	listening := s.listening.Load() && !s.cfg.PollOnly
	notified := listening && !s.polling.Load()
	start := time.Now()
	low, err := s.sweepOnce(ctx, regular)
	defer s.signals.swept.Signal(listening)
	s.metrics.sweepDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	if low == nil {
		s.MarkReady(time.Now())
		return nil
	}
	if s.hooks.sweepMarkOnly {
		return nil
	}
	s.floor.lowerSwept(*low, notified)
	s.signal(wakePoll)
	return nil
}

// sweepOnce runs one sweep's statements, in this order, each with its own
// snapshot (READ COMMITTED): the sequence, the lock holders, the read of
// the lowest id. It moves the low-water mark (nextMark) and returns the
// lowest id (nil: none). The regular sweeps lowwater says are full read
// from the start of the index.
func (s *Service) sweepOnce(ctx context.Context, regular bool) (*int64, error) {
	lw := &s.lw
	full := false
	if regular {
		full = lw.reads.Full(false)
		lw.reads = lw.reads.Next()
	}
	var low *int64
	err := s.calls.Do(ctx, "enqueuer sweep", func(ctx context.Context) (err error) {
		low, err = s.sweepTx(ctx, full)
		return err
	})
	return low, err
}

// sweepTx is the sweep's transaction, one call bounded by
// --database-timeout.
func (s *Service) sweepTx(ctx context.Context, full bool) (*int64, error) {
	lw := &s.lw
	// The mark's statements and the read run in one transaction begun as a
	// move transaction is, so the read walks the index from the mark
	// whatever the planner thinks of the table (see beginSQL).
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		return nil, fmt.Errorf("enqueuer sweep: begin: %w", err)
	}
	defer s.rollback(ctx, tx) // read-only: after Commit, a no-op

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
	next, low, err := nextMark(lw.state, seq, full, func(from int64) (*int64, error) {
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

package enqueuer

import (
	"context"
	"fmt"
	"slices"
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
// snapshot keeps, so the sweep starts at a low-water mark: an id below
// which no staged row can exist now or appear later. It is established
// from the id sequence and the locks on it:
//
//  1. nextval() locks the sequence (RowExclusiveLock, held to the end of
//     the transaction) before it hands out an id, and with CACHE 1 (a
//     serial column's default) every id it hands out is at most the
//     sequence's last value from then on. So if a sweep reads the last
//     value s and then the set V of transactions holding a lock on the
//     sequence, every transaction that holds an id ≤ s is in V or has
//     ended.
//  2. At a later sweep, once no transaction of V is left, every id ≤ s
//     belongs to a transaction that has ended: committed (its rows are
//     visible to any snapshot taken from now on, since a transaction's
//     locks are released after its commit became visible) or rolled back.
//  3. That sweep then reads the lowest committed id m with a new snapshot.
//     No id below min(m, s+1) (and above the previous mark) is staged now,
//     and none can be later: its transaction has ended, and a staged row
//     leaves only by a committed delete. That is the new mark.
//
// A transaction open on the sequence (say an API request that staged a
// row and has not committed) holds the mark where it was until it ends,
// which is right: its row may commit late with a low id. A held snapshot
// that stages nothing (a report, pg_dump) holds nothing. The argument
// needs ids to come from the sequence; a sequence with CACHE > 1 (ids
// handed out later than the last value says) or no sequence at all turns
// the mark off, a sequence that went backwards (setval, TRUNCATE ...
// RESTART IDENTITY) resets it, and every sweepFullEvery-th sweep reads from
// the start of the index anyway, for rows inserted with explicit ids below
// the mark whose notification was also lost.
const sweepFullEvery = 30

// lowWater is the sweep's state.
type lowWater struct {
	mark atomic.Int64 // no staged row has an id below it (fullPass: unknown)
	// cand is the last value and lock holders read at an earlier sweep,
	// waiting for its holders to end; nil: none.
	cand  *lowWaterCandidate
	count int // sweeps so far
}

type lowWaterCandidate struct {
	last    int64    // the sequence's last value (0: none handed out)
	holders []string // virtual transaction ids holding a lock on it
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
// the lowest id. It moves the low-water mark and returns the lowest id (nil:
// none).
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
		seqOID     *uint32
		last       *int64
		cache      *int64
		now        *lowWaterCandidate
		seqUsable  bool
		candResult bool // lw.cand's holders have all ended
	)
	err = tx.QueryRow(ctx, sweepSeqSQL).Scan(&seqOID, &last, &cache)
	switch {
	case err == pgx.ErrNoRows:
	case err != nil:
		return nil, fmt.Errorf("enqueuer sweep: sequence: %w", err)
	default:
		seqUsable = cache != nil && *cache == 1
	}
	if !seqUsable {
		lw.mark.Store(fullPass)
		lw.cand = nil
	} else {
		now = &lowWaterCandidate{last: 0}
		if last != nil {
			now.last = *last
		}
		if err := tx.QueryRow(ctx, sweepHoldersSQL, pgx.NamedArgs{"seq": *seqOID}).Scan(&now.holders); err != nil {
			return nil, fmt.Errorf("enqueuer sweep: sequence locks: %w", err)
		}
		if lw.cand != nil && now.last < lw.cand.last {
			// The sequence went backwards: ids below the mark may come again.
			lw.mark.Store(fullPass)
			lw.cand = nil
		}
		candResult = lw.cand != nil && !slices.ContainsFunc(lw.cand.holders, func(v string) bool {
			return slices.Contains(now.holders, v)
		})
	}

	from := lw.mark.Load()
	if full {
		from = fullPass
	}
	var low *int64
	if err := tx.QueryRow(ctx, sweepSQL, pgx.NamedArgs{"from": from}).Scan(&low); err != nil {
		return nil, fmt.Errorf("enqueuer sweep: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueuer sweep: commit: %w", err)
	}

	if full && low != nil && *low < lw.mark.Load() {
		// A row below the mark: an id that did not come from the sequence.
		lw.mark.Store(*low)
	}
	if seqUsable {
		if candResult {
			mark := lw.cand.last + 1
			if low != nil {
				mark = min(mark, *low)
			}
			if mark > lw.mark.Load() {
				lw.mark.Store(mark)
			}
			lw.cand = nil
		}
		if lw.cand == nil {
			lw.cand = now
		}
	}
	return low, nil
}

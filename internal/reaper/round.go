package reaper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A run reaps in rounds. A round is one batch, or with --concurrency N up
// to N batches at once, each in its own transaction on its own connection,
// on consecutive created_at ranges: the batches a sequential run would take
// next (roundBoundsSQL), so they never touch the same key. One statement
// runs on one server backend, so concurrency is the only way a run can use
// more of the database than one core: with a foreign key whose action runs
// once per deleted key, even a single DELETE of every key is only about 2×
// the article's loop, and a round of two batches is what passes it
// (docs/reaper.md).
//
// Only the fast range form runs concurrently. A batch of a round that needs
// another form (a locked key, an empty range) or timed out is not redone
// inside the round: the next round is that one batch alone, from its start,
// in the sequential path with every fallback. Its range may then reach
// into ranges the round already deleted; those keys are gone and deleting
// is idempotent, so the run only spends an index walk on it.
//
// Rounds run in lockstep: the next starts when every batch of this one
// has ended. The batches fence the lease with a share lock and the run
// renews it before each round; a renewal waits for every fence, and the
// gap between rounds is what lets it (and the heartbeat's) in.

// minCursorID is below every id: a cursor (t, minCursorID) starts at every
// key created at t (sql.go's minID).
const minCursorID = math.MinInt64

// roundWidth is how many batches the next round may run at once: the
// configured concurrency, fewer when --max-deletes or --max-flags leaves
// room for fewer full batches (a batch's own cap check sees only the
// batches committed before the round, so the round as a whole must fit),
// and always at least one. Pure.
func roundWidth(s *Settings, batchSize int, deleted, flagged int64) int {
	w := int64(s.Concurrency)
	if s.MaxDeletes > 0 {
		w = min(w, (s.MaxDeletes-deleted)/int64(batchSize))
	}
	if s.MaxFlags > 0 {
		w = min(w, (s.MaxFlags-flagged)/int64(batchSize))
	}
	return int(max(w, 1))
}

// roundJobs splits a round at starts (roundBoundsSQL's: the created_at of
// the first key from the cursor, then the bounds, ascending) into batches:
// [cursor, b1), [b1, b2), ..., [bk, own end). It stops at the first bound
// that is not after the one before (or after the first key): that batch's
// range would be empty, because more than a batch of keys share a
// created_at, which the sequential path's ordered form handles. Pure.
func roundJobs(template batchJob, starts []time.Time) []batchJob {
	jobs := []batchJob{template}
	if len(starts) == 0 {
		return jobs
	}
	prev := starts[0]
	for _, b := range starts[1:] {
		if !b.After(prev) {
			break
		}
		prev = b
		until := b
		jobs[len(jobs)-1].until = &until
		next := template
		next.cursor = &batchCursor{createdAt: b, id: minCursorID}
		jobs = append(jobs, next)
	}
	return jobs
}

// planRound finds the batches of a round of up to width batches from job's
// cursor.
func (s *Service) planRound(ctx context.Context, job batchJob, width int) ([]batchJob, error) {
	if width <= 1 {
		return []batchJob{job}, nil
	}
	args := s.batchArgs(job)
	args["width"] = width
	var starts []time.Time
	err := s.cfg.Calls.DoWithin(ctx, "reaper round", s.cfg.StatementTimeout, func(ctx context.Context) error {
		rows, err := s.cfg.Pool.Query(ctx, roundBoundsSQL, args)
		if err == nil {
			starts, err = pgx.CollectRows(rows, pgx.RowTo[time.Time])
		}
		if err != nil {
			return fmt.Errorf("reaper: find the round's ranges: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return roundJobs(job, starts), nil
}

// roundEnd is what a round means for the run.
type roundEnd struct {
	// cursor is where the next round starts (after); nil: from the oldest
	// key. A round that leaves more keys always has one, unless it failed
	// from the oldest key.
	cursor *batchCursor
	// more: eligible keys may be left.
	more bool
	// alone: the next round is one batch, redoing a batch of this round
	// in the sequential path.
	alone bool
	// err is the failure the run must judge (batchFailed): that of the one
	// batch of a round of one, or of the first batch of a concurrent round
	// that failed, unless the sequential path's other forms handle it
	// (redoCause; a later batch's failure meets the run again when the
	// rounds reach its range). nil: none.
	err error
	// committed are the round's committed batches, for the run's Result.
	committed []batchResult
}

// runRound runs a round's batches, all at once when there are several,
// and returns the committed ones with what the round means for the run.
func (s *Service) runRound(ctx context.Context, jobs []batchJob) roundEnd {
	if len(jobs) == 1 {
		b, err := s.runBatch(ctx, jobs[0])
		if err != nil {
			return roundEnd{cursor: jobs[0].cursor, more: true, err: err}
		}
		return roundEnd{cursor: b.cursor, more: b.more, committed: []batchResult{b}}
	}

	type tried struct {
		b   batchResult
		err error
	}
	outcomes := make([]tried, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		wg.Go(func() {
			outcomes[i].b, outcomes[i].err = s.tryBatch(ctx, rangeForm, job)
		})
	}
	wg.Wait()

	end := roundEnd{cursor: jobs[0].cursor, more: true}
	var committed []batchResult
	failed := false
	for i, o := range outcomes {
		if o.err != nil {
			if !failed {
				failed = true
				// Every batch after it stays as it is (committed or not);
				// the next round starts at this one's start.
				end = roundEnd{cursor: jobs[i].cursor, more: true, alone: true, err: redoCause(o.err)}
			}
			continue
		}
		s.metrics.concurrentBatches.Inc()
		o.b.concurrent = true
		committed = append(committed, o.b)
		if !failed {
			end.more = o.b.more
			if o.b.cursor != nil {
				end.cursor = o.b.cursor
			}
		}
	}
	end.committed = committed
	return end
}

// redoCause is the error a batch of a concurrent round ended with, as the
// run must see it: nil for the ones the sequential path's other forms
// handle (the batch is simply redone alone), the error itself otherwise.
func redoCause(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, errRangeEmpty):
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
		return nil
	}
	return err
}

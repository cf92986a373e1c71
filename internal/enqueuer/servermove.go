package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemd/idemd/internal/riverdb"
)

// A move is one round trip: BEGIN, the session settings, one statement
// that takes the rows and writes their River jobs, and COMMIT, sent as one
// pipeline.
//
// On the two shared cores of the staging benchmark every round trip of a
// move is a wake-up of the enqueuer process and of its backend that waits
// for a core the API's backends hold; with the take, River's insert and the
// commit sent one after the other, those waits were most of a row's time
// from its commit to River (docs/benchmarks/enqueuer.md). Here the rows
// never leave the server: riverdb.MoveSQL deletes them and inserts their jobs into
// river_job as River's own insert does (JobInsertFastMany: the same
// columns, River's defaults for what the row leaves out, River's insert
// notification for the queues that got available jobs), which is the way
// River's clients in other languages insert jobs. Which rows it can move
// is decided in SQL by the same rules as riverdb.Validator.Check; a batch with any
// row it would refuse moves nothing and goes to the Go path (moveBatch),
// which dead-letters that row with its reason, as does a batch River's
// table refuses (a CHECK constraint validation did not foresee).

// moveBegin is moveBeginSQL one statement at a time, as a pipeline sends
// them.
var moveBegin = strings.Split(moveBeginSQL, "; ")

// serverMoveResult is what one riverdb.MoveSQL did.
type serverMoveResult struct {
	locked, invalid int
	// riverCurrent: River's schema was at the version the move was told;
	// when false the move changed nothing.
	riverCurrent bool
	// moved counts the rows that became River jobs or were duplicates of
	// a unique job (duplicates, also counted apart).
	moved, duplicates int
	last              int64
	gaps              int
	lowestGap         int64
	notified          []string
}

// moveInServer runs one move in one round trip. A batch with an invalid
// row comes back with invalid > 0 and nothing moved; an error that River's
// table raised for a row's data is errRiverRejected.
//
// The whole move, from the pool's acquire to COMMIT, is one call bounded
// by --database-timeout: a batch takes well under a second
// (docs/operations.md, "Sizing"), and one the database does not answer
// is abandoned (its connection closed, the server rolls it back) and
// retried on another connection.
func (s *Service) moveInServer(ctx context.Context, from, gapBelow int64, riverVersion int) (res serverMoveResult, err error) {
	err = s.calls.Do(ctx, batchOp, func(ctx context.Context) (err error) {
		res, err = s.moveInServerOnce(ctx, from, gapBelow, riverVersion)
		return err
	})
	return res, err
}

func (s *Service) moveInServerOnce(ctx context.Context, from, gapBelow int64, riverVersion int) (res serverMoveResult, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("enqueuer batch: acquire: %w", err)
	}
	// A failed pipeline leaves the transaction open (aborted, or not yet
	// committed): roll it back, and if that fails too the pool closes a
	// connection it gets back in a transaction.
	defer func() {
		if err != nil {
			cctx, cancel := s.calls.Cleanup(ctx)
			conn.Exec(cctx, "ROLLBACK") //nolint:errcheck // the error is err
			cancel()
		}
		conn.Release()
	}()
	b := &pgx.Batch{}
	for _, q := range moveBegin {
		b.Queue(q)
	}
	b.Queue(riverdb.MoveSQL, s.moveArgs(from, gapBelow, riverVersion))
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("enqueuer batch: move: %w", cerr)
		}
	}()
	for range moveBegin {
		if _, err := br.Exec(); err != nil {
			return res, fmt.Errorf("enqueuer batch: begin: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&res.locked, &res.invalid, &res.riverCurrent, &res.moved, &res.duplicates, &res.last, &res.gaps, &res.lowestGap, &res.notified); err != nil {
		if isDataError(err, conn.Conn()) {
			return res, fmt.Errorf("enqueuer batch: %w: %w", errRiverRejected, err)
		}
		return res, fmt.Errorf("enqueuer batch: move: %w", err)
	}
	tag, err := br.Exec()
	if err != nil {
		return res, fmt.Errorf("enqueuer batch: commit: %w", err)
	}
	if tag.String() != "COMMIT" {
		return res, fmt.Errorf("enqueuer batch: commit: %w", pgx.ErrTxCommitRollback)
	}
	s.notices.sent(res.notified, time.Now())
	return res, nil
}

func (s *Service) moveArgs(from, gapBelow int64, riverVersion int) pgx.NamedArgs {
	return riverdb.MoveArgs(&s.valid, from, gapBelow, s.cfg.BatchSize, s.notices.quiet(time.Now()), riverVersion)
}

// insertNotices limits River's insert notifications as River's own client
// does: at most one a queue per river.FetchCooldownDefault, the interval
// River's producers wait between fetches anyway.
type insertNotices struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// quiet lists the queues notified less than the cooldown before now.
func (n *insertNotices) quiet(now time.Time) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := []string{}
	for queue, at := range n.last {
		if now.Sub(at) < river.FetchCooldownDefault {
			q = append(q, queue)
		} else {
			delete(n.last, queue)
		}
	}
	return q
}

func (n *insertNotices) sent(queues []string, now time.Time) {
	if len(queues) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.last == nil {
		n.last = make(map[string]time.Time)
	}
	for _, q := range queues {
		n.last[q] = now
	}
}

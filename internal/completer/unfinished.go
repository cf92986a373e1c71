package completer

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/review"
)

// pruneBatch is the rows one pruneSQL statement walks.
const pruneBatch = 1000

// maybePrune prunes from the position from (the pass's mark read's start,
// mark.go) at most once per poll interval.
func (s *Service) maybePrune(ctx context.Context, from position) {
	s.mu.Lock()
	if time.Since(s.lastPrune) < s.cfg.PollInterval {
		s.mu.Unlock()
		return
	}
	s.lastPrune = time.Now()
	s.mu.Unlock()
	if n, err := s.prune(ctx, from); err != nil && ctx.Err() == nil {
		log := s.log.Warn
		if dbcall.IsTimeout(err) {
			log = s.log.Debug // internal/dbcall logs the database's silence once
		}
		log("pruning idemd_unfinished_keys failed", zap.Error(err))
	} else if n > 0 {
		s.log.Debug("pruned idemd_unfinished_keys", zap.Int("deleted", n))
	}
}

// Prune deletes the idemd_unfinished_keys rows of keys that are finished,
// given up or gone, and returns how many it deleted. The trigger records
// every key inserted unfinished, and the API finishes most of them itself
// without the completer seeing them; Prune (once per poll interval) keeps
// the table about the size of the backlog plus the keys inserted since the
// last prune, so the candidate walk, which stops at the grace period, sees
// the backlog alone. It walks the table in bounded statements
// (pruneBatch rows each), from the start; a pass prunes from where it
// reads its low-water mark (mark.go).
func (s *Service) Prune(ctx context.Context) (int, error) {
	return s.prune(ctx, walkStart)
}

// prune is Prune from the position from on.
func (s *Service) prune(ctx context.Context, from position) (int, error) {
	// pruneSQL continues after its cursor: start just before from.
	cursorAt, cursorID := from.At, from.ID
	if cursorID > math.MinInt64 {
		cursorID--
	}
	deleted := 0
	for {
		var walked, pruned int
		args := pgx.NamedArgs{"cursor_at": cursorAt, "cursor_id": cursorID, "walk": pruneBatch}
		if err := s.inWalkTx(ctx, "completer: prune", func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, pruneSQL, args).Scan(&walked, &pruned, &cursorAt, &cursorID)
		}); err != nil {
			return deleted, fmt.Errorf("completer: prune: %w", err)
		}
		deleted += pruned
		if walked < pruneBatch {
			return deleted, nil
		}
	}
}

// Querier is what CountUnfinished reads through: a pool, a connection or a
// transaction (idemctl status reads in one snapshot).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// UnfinishedKeys is the part of the completer's backlog at one recovery
// point: keys unfinished and not given up.
type UnfinishedKeys struct {
	RecoveryPoint string
	Count         int64
	Oldest        time.Time     // created_at of the oldest
	OldestAge     time.Duration // its age by the database clock
}

// CountUnfinished counts the unfinished keys the completer may still work
// on, by recovery point (in recovery-point order; none when there are
// none). It is the one definition of the completer's backlog: the
// idemd_completer_keys_pending gauges and idemctl status both read it. It
// walks only idemd_unfinished_keys and the primary key of
// idempotency_keys.
func CountUnfinished(ctx context.Context, q Querier) ([]UnfinishedKeys, error) {
	return countUnfinished(ctx, q, walkStart)
}

// countUnfinished is CountUnfinished over the tracked rows at or above
// from. The completer's gauges count from its low-water mark, so their
// cost does not grow with the dead entries a held snapshot keeps below it;
// they miss only keys committed below the mark, which the next full walk
// finds and counts (idemd_completer_keys_below_mark_total).
func countUnfinished(ctx context.Context, q Querier, from position) ([]UnfinishedKeys, error) {
	rows, err := q.Query(ctx, unfinishedKeysSQL, pgx.NamedArgs{"from_at": from.At, "from_id": from.ID})
	if err != nil {
		return nil, fmt.Errorf("completer: unfinished keys: %w", err)
	}
	groups, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnfinishedKeys, error) {
		var g UnfinishedKeys
		var age float64
		err := r.Scan(&g.RecoveryPoint, &g.Count, &g.Oldest, &age)
		g.OldestAge = time.Duration(age * float64(time.Second))
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("completer: unfinished keys: %w", err)
	}
	return groups, nil
}

// gaugesLoop refreshes the backlog gauges beside the main loop, at once
// and then every --poll-interval, so they move while a long pass drains.
func (s *Service) gaugesLoop() lifecycle.Loop {
	return lifecycle.Loop{
		Pass: func(ctx context.Context) error {
			err := s.RefreshGauges(ctx)
			if err != nil && ctx.Err() == nil {
				log := s.log.Warn
				if dbcall.IsTimeout(err) {
					log = s.log.Debug // internal/dbcall logs the database's silence once
				}
				log("refreshing backlog gauges failed", zap.Error(err))
			}
			return err
		},
		Next: func() time.Duration { return s.cfg.PollInterval },
	}
}

// gaugesOp names the gauges' reads when they run out of their bound.
const gaugesOp = "completer: gauges"

// RefreshGauges recomputes keys pending by recovery point and the oldest
// unfinished key's age (countUnfinished from the low-water mark, in a walk
// transaction), and the open reviews by reason and the oldest one's age
// (the partial index of open reviews). Every review reason is always
// exported, at 0 when none is open, so an alert on them never sees an
// absent series.
func (s *Service) RefreshGauges(ctx context.Context) error {
	s.walk.mu.Lock()
	from := s.walk.state.mark
	s.walk.mu.Unlock()
	var groups []UnfinishedKeys
	if err := s.inWalkTx(ctx, gaugesOp, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		groups, err = countUnfinished(ctx, tx, from)
		return err
	}); err != nil {
		return err
	}
	s.metrics.pending.Reset()
	var oldest time.Duration
	for _, g := range groups {
		s.metrics.pending.WithLabelValues(g.RecoveryPoint).Set(float64(g.Count))
		oldest = max(oldest, g.OldestAge)
	}
	s.metrics.oldestAge.Set(oldest.Seconds())
	var reviews []review.OpenGroup
	err := s.calls.Do(ctx, gaugesOp, func(ctx context.Context) (err error) {
		reviews, err = review.Open(ctx, s.pool)
		return err
	})
	if err != nil {
		return err
	}
	s.metrics.openReviews.Reset()
	for _, r := range review.Reasons() { // every reason has a series, 0 when none is open
		s.metrics.openReviews.WithLabelValues(r).Set(0)
	}
	var oldestReview time.Duration
	for _, g := range reviews {
		s.metrics.openReviews.WithLabelValues(g.Reason).Set(float64(g.Count))
		oldestReview = max(oldestReview, g.Age)
	}
	s.metrics.oldestReview.Set(oldestReview.Seconds())
	return nil
}

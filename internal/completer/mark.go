package completer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lowwater"
)

// Where the candidate walk and Prune start: the low-water mark
// (internal/lowwater says what the enqueuer's sweep shares with it).
//
// Every key the API inserts unfinished gets a row in idemd_unfinished_keys
// and the completer deletes the rows of keys that finished (untrack,
// Prune). A deleted row stays in the table's primary key until VACUUM
// removes it, and VACUUM cannot while any transaction holds a snapshot
// older than the delete (a long REPEATABLE READ report, pg_dump). A walk
// from the start of the primary key visits every such entry, so the cost
// of a claim grew with the age of the oldest snapshot. The walks start
// at a low-water mark instead: a position in the walk order
// (created_at, key_id) below which no tracked row exists.
//
// Each pass reads the mark once, before it claims (readMark): the lowest
// tracked row at or above the previous mark, with a plain read (rows the
// API or another replica holds locked are seen too), and the mark becomes
// min(that row, now() - --grace - markMargin) by the database clock. It is
// a position, not a filter: the lowest *tracked* row, due or not (a key
// backing off, idle or leased holds the mark where it is), so the walk from
// it meets every row the walk from the start would, except rows that
// appeared below the mark after it was read.
//
// Such a row is a key whose inserting transaction committed after a mark
// read had passed its created_at. created_at is the inserting
// transaction's start (now()), and the mark never passes
// now() - --grace - markMargin, so that takes a transaction open for longer
// than --grace + markMargin (5m + 1m at the defaults) between inserting
// the key and committing, or a key inserted with an explicit old
// created_at. Every lowwater.FullEvery-th pass (the first one included)
// and every --once pass reads the mark from the start of the index
// instead: it finds those rows, the mark drops to the lowest of them and
// the pass claims them. So such a key waits at most FullEvery × --poll-interval
// (5m at the defaults) beyond when it would have been due; a completer
// works on keys abandoned for --grace already, so that is acceptable.
// Those rows are counted (idemd_completer_keys_below_mark_total, logged
// once): they should not happen.
//
// The mark bounds the dead entries a claim walks to those above the oldest
// tracked row and above now() - --grace - markMargin; the claim walks up
// to now() - --grace, so while no key is tracked for long it walks
// markMargin of dead entries at most, whatever the age of the oldest
// snapshot. A key tracked for long (backing off for hours) holds the mark
// at its row, and the dead entries of every key finished since are walked
// again: the mark helps against the keys finished before the oldest
// tracked one, not between tracked ones.

// markMargin is how far behind now() - --grace the mark stays at least, for
// the transactions that insert a key and commit later.
const markMargin = time.Minute

// position is a place in the walk order of idemd_unfinished_keys' primary
// key, (created_at, key_id).
type position struct {
	At time.Time
	ID int64
}

// walkStart is before every row.
var walkStart = position{At: time.Time{}, ID: math.MinInt64}

func (p position) before(q position) bool {
	if !p.At.Equal(q.At) {
		return p.At.Before(q.At)
	}
	return p.ID < q.ID
}

// markState is what one pass's mark read leaves the next.
type markState struct {
	mark  position // no tracked row below it (walkStart: unknown)
	reads lowwater.Reads
}

// markReading is what one mark read found.
type markReading struct {
	lowest *position // the lowest tracked row at or above where it read from (nil: none)
	bound  time.Time // now() - --grace - markMargin, by the database clock
	// below: unfinished keys tracked below the previous mark (full reads
	// only; 0 otherwise).
	below int
}

// planRead says where this pass reads the mark from: the previous mark,
// or the start of the index (full) when lowwater says so (the first read,
// every FullEvery-th, a forced one: --once) and while there is no mark.
func planRead(st markState, force bool) (from position, full bool) {
	if st.reads.Full(force) || st.mark == walkStart {
		return walkStart, true
	}
	return st.mark, false
}

// nextMark is one mark read's decision: the mark is the lowest tracked row
// the read found, but never above r.bound (a transaction that inserted a key
// and has not committed yet may commit it there); with no tracked row, the
// bound. gaps is the unfinished keys a full read found below the previous
// mark.
func nextMark(st markState, full bool, r markReading) (next markState, gaps int) {
	mark := position{At: r.bound, ID: math.MinInt64}
	if r.lowest != nil && r.lowest.before(mark) {
		mark = *r.lowest
	}
	if full && st.mark != walkStart {
		gaps = r.below
	}
	return markState{mark: mark, reads: st.reads.Next()}, gaps
}

// inWalkTx runs fn in a transaction begun with lowwater.BeginSQL, so its walks
// of idemd_unfinished_keys go through the primary key from the mark.
//
// The transaction is one call, op, bounded by --database-timeout: fn gets
// the call's context and must run its statements on it.
func (s *Service) inWalkTx(ctx context.Context, op string, fn func(context.Context, pgx.Tx) error) error {
	return s.calls.Do(ctx, op, func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: lowwater.BeginSQL}, func(tx pgx.Tx) error {
			return fn(ctx, tx)
		})
	})
}

// walker holds the mark between passes.
type walker struct {
	mu    sync.Mutex
	state markState
	// logged: the first keys below the mark were logged.
	logged sync.Once
}

// startWalks begins a pass's walks: it prunes (at most once per poll
// interval) from where it reads the mark, reads the mark (from the
// previous one, or from the start on a full read; force: --once) and
// returns it, where the pass's claims start. On a failed read the mark
// stays as it was and the next pass reads from the same place.
func (s *Service) startWalks(ctx context.Context, force bool) (position, error) {
	s.walk.mu.Lock()
	st := s.walk.state
	s.walk.mu.Unlock()
	from, full := planRead(st, force)
	s.maybePrune(ctx, from)
	below := walkStart // a range with nothing in it
	if full {
		below = st.mark
	}
	var (
		r      markReading
		lowAt  *time.Time
		lowID  *int64
		belowN int64
	)
	args := pgx.NamedArgs{
		"grace": s.cfg.Grace, "margin": markMargin,
		"from_at": from.At, "from_id": from.ID,
		"below_at": below.At, "below_id": below.ID,
	}
	if err := s.inWalkTx(ctx, "completer: low-water mark", func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, markSQL, args).Scan(&r.bound, &lowAt, &lowID, &belowN); err != nil {
			return fmt.Errorf("completer: low-water mark: %w", err)
		}
		return nil
	}); err != nil {
		return st.mark, err
	}
	if lowAt != nil && lowID != nil {
		r.lowest = &position{At: *lowAt, ID: *lowID}
	}
	r.below = int(belowN)
	next, gaps := nextMark(st, full, r)
	s.walk.mu.Lock()
	s.walk.state = next
	s.walk.mu.Unlock()
	if gaps > 0 {
		s.metrics.keysBelowMark.Add(float64(gaps))
		s.walk.logged.Do(func() {
			s.log.Warn("a full walk found unfinished keys tracked below the low-water mark: a transaction committed a key more than --grace + 1m after it began, or a key was inserted with an old created_at; such keys wait for a full walk, up to 30 x --poll-interval (logged once; idemd_completer_keys_below_mark_total counts them)",
				zap.Int("keys", gaps), zap.Time("mark_at", st.mark.At))
		})
	}
	return next.mark, nil
}

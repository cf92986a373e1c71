package reaper

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestRoundWidth(t *testing.T) {
	for _, c := range []struct {
		name                   string
		concurrency            int
		maxDeletes, maxFlags   int64
		size                   int
		deleted, flagged, want int64
	}{
		{name: "no caps", concurrency: 3, size: 10, want: 3},
		{name: "one", concurrency: 1, size: 10, want: 1},
		{name: "deletes leave room for two full batches", concurrency: 3, maxDeletes: 25, size: 10, want: 2},
		{name: "deletes used up the room", concurrency: 3, maxDeletes: 25, size: 10, deleted: 10, want: 1},
		{name: "flags leave room for none", concurrency: 3, maxFlags: 5, size: 10, want: 1},
		{name: "flags leave room for three", concurrency: 3, maxFlags: 35, size: 10, flagged: 5, want: 3},
		{name: "past the cap", concurrency: 3, maxDeletes: 5, size: 10, deleted: 8, want: 1},
	} {
		s := Settings{Concurrency: c.concurrency, MaxDeletes: c.maxDeletes, MaxFlags: c.maxFlags}
		if got := roundWidth(&s, c.size, c.deleted, c.flagged); int64(got) != c.want {
			t.Errorf("%s: width %d, want %d", c.name, got, c.want)
		}
	}
}

func TestRoundJobs(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type span struct {
		from  *batchCursor
		until *time.Time
	}
	spans := func(jobs []batchJob) []span {
		var out []span
		for _, j := range jobs {
			out = append(out, span{j.cursor, j.until})
		}
		return out
	}
	eq := func(a, b []span) bool {
		return slices.EqualFunc(a, b, func(x, y span) bool {
			return (x.from == nil) == (y.from == nil) && (x.from == nil || *x.from == *y.from) &&
				(x.until == nil) == (y.until == nil) && (x.until == nil || x.until.Equal(*y.until))
		})
	}
	p := func(tm time.Time) *time.Time { return &tm }
	start := &batchCursor{createdAt: at(0), id: 7}
	for _, c := range []struct {
		name   string
		cursor *batchCursor
		starts []time.Time
		want   []span
	}{
		{"no key", start, nil, []span{{start, nil}}},
		{"no bound: one batch", start, []time.Time{at(1)}, []span{{start, nil}}},
		{"from the oldest key", nil, []time.Time{at(1), at(5), at(9)},
			[]span{{nil, p(at(5))}, {&batchCursor{at(5), minCursorID}, p(at(9))}, {&batchCursor{at(9), minCursorID}, nil}}},
		{"from a cursor", start, []time.Time{at(0), at(5)},
			[]span{{start, p(at(5))}, {&batchCursor{at(5), minCursorID}, nil}}},
		// More than a batch of keys on the first key's created_at: the
		// first range would be empty, so the round is the one batch, which
		// the sequential path redoes in id order.
		{"bound at the first key", nil, []time.Time{at(1), at(1), at(5)}, []span{{nil, nil}}},
		{"equal bounds stop the round", start, []time.Time{at(0), at(5), at(5), at(9)},
			[]span{{start, p(at(5))}, {&batchCursor{at(5), minCursorID}, nil}}},
	} {
		got := spans(roundJobs(batchJob{batchSize: 10, cursor: c.cursor}, c.starts))
		if !eq(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// overlap is an inBatch hook that holds the first n batches to reach it
// until all n are there: a run whose batches never run at once fails the
// test at the deadline instead of passing. Later batches pass through.
type overlap struct {
	t       *testing.T
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{}
	// during, when set, runs once while the n batches are held.
	during func()
}

func newOverlap(t *testing.T, n int) *overlap { return &overlap{t: t, n: n, all: make(chan struct{})} }

func (o *overlap) hook(ctx context.Context, _ pgx.Tx) {
	o.mu.Lock()
	if o.arrived >= o.n {
		o.mu.Unlock()
		return
	}
	o.arrived++
	if o.arrived == o.n {
		if o.during != nil {
			o.during()
		}
		close(o.all)
	}
	o.mu.Unlock()
	select {
	case <-o.all:
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		o.t.Errorf("only %d of %d batches ran at once", o.arrived, o.n)
	}
}

// TestConcurrentRoundsDeleteEveryEligibleKeyOnce: with --concurrency 3
// three batches are in their transactions at once (the hook holds them
// until all three are), and the run deletes exactly the eligible keys,
// clears the rides' references and flags each unfinished key once, by the
// tables' own counts.
func TestConcurrentRoundsDeleteEveryEligibleKeyOnce(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 300) // 100 unfinished
	t0 := dbNow(t, pool)
	inFlight := insertKey(t, pool, keySpec{name: "in-flight", createdAt: t0.Add(-90 * time.Hour), lockedAt: ptr(t0.Add(-time.Second))})
	young := insertKey(t, pool, keySpec{name: "young", createdAt: t0})
	createRides(t, pool, "SET NULL", append(ids[:150:150], inFlight, young)...)

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 20; s.Concurrency = 3 })
	o := newOverlap(t, 3)
	svc.hooks.inBatch = o.hook
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 300 || res.Flagged != 100 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if res.ConcurrentBatches < 3 {
		t.Fatalf("%d batches ran beside others, want at least one round of 3", res.ConcurrentBatches)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys WHERE id = ANY($1)", ids); got != 0 {
		t.Fatalf("%d eligible keys left", got)
	}
	if !keyExists(t, pool, inFlight) || !keyExists(t, pool, young) {
		t.Fatal("the in-flight or the young key was deleted")
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id IS NULL"); got != 150 {
		t.Fatalf("%d rides lost their key, want 150", got)
	}
	if got := queryInt(t, pool, "SELECT count(DISTINCT key_id) FROM idempotency_key_reviews"); got != 100 {
		t.Fatalf("%d keys flagged, want 100", got)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); got != 100 {
		t.Fatalf("%d reviews for 100 keys", got)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews WHERE NOT key_id = ANY($1)", ids); got != 0 {
		t.Fatalf("%d reviews of keys that were not deleted", got)
	}
}

// TestConcurrentRoundRedoesALockedBatchAlone: a key held locked in the
// second batch's range makes that batch of the round fail its lock wait;
// it is redone alone, skipping the locked key, and every other key goes.
func TestConcurrentRoundRedoesALockedBatchAlone(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 60)
	locked := ids[14] // in the second range of the first round: [10, 20)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE", locked); err != nil {
		t.Fatal(err)
	}

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10; s.Concurrency = 3 })
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 59 || res.LockedBatches != 1 || res.ConcurrentBatches == 0 {
		t.Fatalf("run with a locked key: %+v, %v", res, err)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); got != 1 || !keyExists(t, pool, locked) {
		t.Fatalf("%d keys left, want only the locked one", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := svc.RunOnce(ctx); err != nil || res.Deleted != 1 {
		t.Fatalf("run after the lock is gone: %+v, %v", res, err)
	}
}

// TestConcurrentRoundsWhenKeysShareCreatedAt: 25 keys on one created_at
// and 30 after it, batches of 10 three at a time. Where the bounds stop
// increasing the round shrinks and the batches on the shared created_at are
// taken alone in id order; every round deletes at most 3 batches' worth.
func TestConcurrentRoundsWhenKeysShareCreatedAt(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
SELECT now() - interval '100 hours' + CASE WHEN g <= 25 THEN interval '0' ELSE g * interval '1 second' END,
       'k-' || g, NULL, 'POST', '{}', '/rides', 'finished', 7
FROM generate_series(1, 55) g`); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10; s.Concurrency = 3 })
	left := []int64{55}
	svc.hooks.afterRound = func(context.Context, int) {
		left = append(left, queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"))
	}
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 55 || res.OrderedBatches < 2 || res.ConcurrentBatches == 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	for i := 1; i < len(left); i++ {
		if d := left[i-1] - left[i]; d > 30 {
			t.Fatalf("a round deleted %d keys (left after each round: %v)", d, left)
		}
	}
}

// TestCapsHoldWithConcurrency: a run may not pass --max-deletes or
// --max-flags by running batches at once: with room for fewer full batches
// than --concurrency the rounds shrink, and a run over a cap is refused as
// without concurrency.
func TestCapsHoldWithConcurrency(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 30) // 10 unfinished
	before := tableDigest(t, pool)
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 4; s.Concurrency = 3; s.MaxDeletes = 29 })
	if res, err := svc.RunOnce(ctx); !errors.Is(err, ErrCapExceeded) || res.Deleted != 0 {
		t.Fatalf("run over --max-deletes: %+v, %v", res, err)
	}
	if tableDigest(t, pool) != before {
		t.Fatal("a refused run changed the tables")
	}
	svc = newService(t, pool, func(s *Settings) { s.BatchSize = 4; s.Concurrency = 3; s.MaxDeletes = 30; s.MaxFlags = 10 })
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 30 || res.Flagged != 10 || res.ConcurrentBatches == 0 {
		t.Fatalf("run at the caps: %+v, %v", res, err)
	}
}

// TestConcurrentRoundHoldsTheLease: while a round's batches are in their
// transactions, another run finds the lease busy and does nothing.
func TestConcurrentRoundHoldsTheLease(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 40)
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10; s.Concurrency = 2 })
	o := newOverlap(t, 2)
	var other *Result
	var otherErr error
	o.during = func() {
		other, otherErr = newService(t, pool, nil).RunOnce(ctx)
	}
	svc.hooks.inBatch = o.hook
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Deleted != 40 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if otherErr != nil || other == nil || !other.LockHeld || other.Deleted != 0 {
		t.Fatalf("run during the round: %+v, %v", other, otherErr)
	}
}

// TestShutdownDuringAConcurrentRound: the context ending while a round's
// batches run rolls every one of them back; the run stops as shut down.
func TestShutdownDuringAConcurrentRound(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertOldKeys(t, pool, 40)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10; s.Concurrency = 2 })
	o := newOverlap(t, 2)
	o.during = cancel
	svc.hooks.inBatch = o.hook
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Complete || res.StopReason != "shutdown" || res.Deleted != 0 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); got != 40 {
		t.Fatalf("%d keys left, want all 40", got)
	}
}

// TestConcurrencyNeedsThePool: --concurrency above the pool's connections
// is a configuration error naming the fix.
func TestConcurrencyNeedsThePool(t *testing.T) {
	// The pool connects lazily: New only reads its size.
	cfg, err := pgxpool.ParseConfig(dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := testSettings()
	s.Concurrency = 3
	if _, err := New(Config{Settings: s, Pool: pool}); err == nil || !strings.Contains(err.Error(), "pool_max_conns=3") {
		t.Fatalf("New: %v", err)
	}
	s.Concurrency = 0
	if _, err := New(Config{Settings: s, Pool: pool}); err == nil || !strings.Contains(err.Error(), "--concurrency 0") {
		t.Fatalf("New: %v", err)
	}
}

package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func ptr[T any](v T) *T { return &v }

// TestBoundaries puts keys at every edge of eligibility, with the run's
// clock pinned to the database's now() at insert time so ±1 s is exact.
func TestBoundaries(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	t0 := dbNow(t, pool)
	const R, LW = 72 * time.Hour, time.Hour
	horizon := t0.Add(-R)
	sec := time.Second

	type want struct {
		deleted bool
		flags   []string
	}
	cases := []struct {
		spec keySpec
		want want
	}{
		{keySpec{name: "finished-past", createdAt: horizon.Add(-sec)}, want{deleted: true}},
		{keySpec{name: "finished-at-horizon", createdAt: horizon}, want{}},
		{keySpec{name: "finished-young", createdAt: horizon.Add(sec)}, want{}},
		{keySpec{name: "finished-new", createdAt: t0}, want{}},
		{keySpec{name: "unfinished-past", createdAt: horizon.Add(-sec), point: "started"}, want{true, []string{review.ReasonUnfinishedAtRetention}}},
		{keySpec{name: "unfinished-young", createdAt: horizon.Add(sec), point: "ride_created"}, want{}},
		{keySpec{name: "unfinished-past-locked-in-flight", createdAt: horizon.Add(-time.Hour), point: "started", lockedAt: ptr(t0.Add(-LW + sec))}, want{}},
		{keySpec{name: "finished-past-locked-in-flight", createdAt: horizon.Add(-sec), lockedAt: ptr(t0.Add(-sec))}, want{}},
		{keySpec{name: "unfinished-past-lock-abandoned", createdAt: horizon.Add(-time.Hour), point: "started", lockedAt: ptr(t0.Add(-LW - sec))}, want{true, []string{review.ReasonUnfinishedAtRetention}}},
		{keySpec{name: "finished-past-lock-at-window", createdAt: horizon.Add(-sec), lockedAt: ptr(t0.Add(-LW))}, want{}},
		{keySpec{name: "unfinished-young-locked", createdAt: horizon.Add(sec), point: "started", lockedAt: ptr(t0)}, want{}},
		{keySpec{name: "unfinished-past-leased", createdAt: horizon.Add(-sec), point: "started", leasedUntil: ptr(t0.Add(sec))}, want{}},
		{keySpec{name: "unfinished-past-lease-expired", createdAt: horizon.Add(-sec), point: "started", leasedUntil: ptr(t0.Add(-sec))}, want{true, []string{review.ReasonUnfinishedAtRetention}}},
		{keySpec{name: "gave-up-unflagged", createdAt: horizon.Add(-sec), point: "started", gaveUpAt: ptr(t0.Add(-48 * time.Hour))}, want{true, []string{review.ReasonCompleterGaveUp}}},
		{keySpec{name: "gave-up-young", createdAt: horizon.Add(sec), point: "started", gaveUpAt: ptr(t0)}, want{}},
	}
	ids := make([]int64, len(cases))
	for i, c := range cases {
		ids[i] = insertKey(t, pool, c.spec)
	}
	// The completer already flagged one given-up key, and a human resolved
	// another's review: neither is flagged again at deletion.
	flaggedByCompleter := insertKey(t, pool, keySpec{name: "gave-up-flagged", createdAt: horizon.Add(-sec), point: "started", gaveUpAt: ptr(t0.Add(-48 * time.Hour))})
	if _, err := review.Flag(ctx, pool, flaggedByCompleter, review.ReasonCompleterGaveUp, "5 attempts", "completer"); err != nil {
		t.Fatal(err)
	}
	resolved := insertKey(t, pool, keySpec{name: "gave-up-resolved", createdAt: horizon.Add(-sec), point: "started", gaveUpAt: ptr(t0.Add(-48 * time.Hour))})
	if _, err := review.Flag(ctx, pool, resolved, review.ReasonCompleterGaveUp, "5 attempts", "completer"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE idempotency_key_reviews SET resolved_at = now(), resolved_by = 'ops' WHERE key_id = $1", resolved); err != nil {
		t.Fatal(err)
	}

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 2 })
	svc.pinnedNow = &t0
	left := []int64{queryInt(t, pool, "SELECT count(*) FROM idempotency_keys")}
	svc.hooks.afterRound = func(context.Context, int) {
		left = append(left, queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"))
	}
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatalf("runOnce: %v", err)
	}

	wantDeleted, wantFlagged := int64(2), int64(0) // the two flagged-before keys
	for i, c := range cases {
		if got := !keyExists(t, pool, ids[i]); got != c.want.deleted {
			t.Errorf("%s: deleted = %v, want %v", c.spec.name, got, c.want.deleted)
		}
		if got := reviewReasons(t, pool, ids[i]); !slices.Equal(got, c.want.flags) {
			t.Errorf("%s: reviews = %v, want %v", c.spec.name, got, c.want.flags)
		}
		if c.want.deleted {
			wantDeleted++
		}
		wantFlagged += int64(len(c.want.flags))
	}
	for _, id := range []int64{flaggedByCompleter, resolved} {
		if keyExists(t, pool, id) {
			t.Errorf("given-up key %d was not deleted", id)
		}
		if got := reviewReasons(t, pool, id); len(got) != 1 {
			t.Errorf("given-up key %d has reviews %v, want the completer's one only", id, got)
		}
	}
	if res.Deleted != wantDeleted || res.Flagged != wantFlagged || res.Unprocessable != wantFlagged+2 {
		t.Errorf("result deleted=%d flagged=%d unprocessable=%d, want %d, %d, %d", res.Deleted, res.Flagged, res.Unprocessable, wantDeleted, wantFlagged, wantFlagged+2)
	}
	if !res.Complete || len(left) != res.Batches+1 {
		t.Errorf("complete=%v batches=%d, keys left after each batch %v", res.Complete, res.Batches, left)
	}
	for i := 1; i < len(left); i++ {
		if d := left[i-1] - left[i]; d > 2 {
			t.Errorf("batch %d deleted %d keys, more than --batch-size 2 (keys left after each batch %v)", i, d, left)
		}
	}

	// The review holds the full row as it was when deleted.
	var snap map[string]any
	if err := pool.QueryRow(ctx, "SELECT snapshot FROM idempotency_key_reviews WHERE key_id = $1", ids[4]).Scan(&snap); err != nil {
		t.Fatal(err)
	}
	if snap["idempotency_key"] != "unfinished-past" || snap["recovery_point"] != "started" || snap["request_params"] == nil || snap["request_path"] != "/rides" {
		t.Errorf("snapshot incomplete: %v", snap)
	}

	// A second run finds nothing to do.
	res2, err := svc.RunOnce(ctx)
	if err != nil || res2.Deleted != 0 || res2.Flagged != 0 || !res2.Complete {
		t.Fatalf("second run: %+v, %v", res2, err)
	}
}

// TestDatabaseClockDecides does not pin the clock: the statement's now()
// decides.
func TestDatabaseClockDecides(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, request_method, request_params, request_path, recovery_point, user_id, locked_at)
VALUES (now() - interval '72 hours' - interval '1 minute', 'old', 'POST', '{}', '/', 'finished', 1, NULL),
       (now() - interval '72 hours' + interval '1 minute', 'young', 'POST', '{}', '/', 'finished', 1, NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, nil)
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || queryInt(t, pool, "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'young'") != 1 {
		t.Fatalf("deleted %d; want only the key past the horizon", res.Deleted)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 30) // 10 unfinished
	insertKey(t, pool, keySpec{name: "young", createdAt: dbNow(t, pool)})
	if _, err := review.Flag(ctx, pool, ids[2], review.ReasonUnfinishedAtRetention, "", "test"); err != nil {
		t.Fatal(err)
	}
	before := tableDigest(t, pool)

	svc := newService(t, pool, func(s *Settings) { s.DryRun = true; s.BatchSize = 7; s.MaxDeletes = 10 })
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := tableDigest(t, pool); after != before {
		t.Fatal("dry run changed the tables")
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idemd_reaper_runs"); n != 0 {
		t.Fatalf("the dry run left %d rows in the run history", n)
	}
	if res.Plan == nil || res.Plan.Deletes != 30 || res.Plan.Flags != 9 || res.Deleted != 0 || res.Batches != 0 {
		t.Fatalf("dry run result %+v (plan %+v); want 30 deletes, 9 new flags", res, res.Plan)
	}
	text := dryRunText(t, svc, res)
	for _, want := range []string{"would delete 30 keys", "would flag 9 keys", "exceeds --max-deletes 10", "bulk-6", "unfinished_at_retention"} {
		if !strings.Contains(text, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "bulk-3\t") || strings.Contains(text, "bulk-3 ") {
		t.Errorf("dry run lists bulk-3, which is already flagged:\n%s", text)
	}

	// What the dry run predicted is what a run does.
	real := newService(t, pool, func(s *Settings) { s.BatchSize = 7 })
	got, err := real.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Deleted != res.Plan.Deletes || got.Flagged != res.Plan.Flags {
		t.Fatalf("run deleted %d flagged %d; dry run said %d and %d", got.Deleted, got.Flagged, res.Plan.Deletes, res.Plan.Flags)
	}
}

// TestConcurrentRunsNeverOverlap: one run holds the lock (stopped by a hook
// right after taking it); a second run at that moment does nothing and
// succeeds. Then many runs race; at no point are two inside the lock.
func TestConcurrentRunsNeverOverlap(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 90) // 30 unfinished

	first := newService(t, pool, func(s *Settings) { s.BatchSize = 10 })
	locked, release := make(chan struct{}), make(chan struct{})
	first.hooks.afterLock = func(context.Context) { close(locked); <-release }
	type outcome struct {
		res *Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := first.RunOnce(ctx)
		done <- outcome{r, err}
	}()
	<-locked
	second := newService(t, pool, nil)
	res, err := second.RunOnce(ctx)
	if err != nil || !res.LockHeld || res.Deleted != 0 {
		t.Fatalf("second run while the first holds the lock: %+v, %v", res, err)
	}
	close(release)
	o := <-done
	if o.err != nil || o.res.Deleted != 90 || o.res.Flagged != 30 {
		t.Fatalf("first run: %+v, %v", o.res, o.err)
	}

	// The race: 8 runs start together on fresh work.
	insertOldKeys(t, pool, 200)
	var inside, maxInside atomic.Int32
	var total, flagged atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 8 {
		svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10 })
		enter := func(context.Context) {
			n := inside.Add(1)
			for {
				m := maxInside.Load()
				if n <= m || maxInside.CompareAndSwap(m, n) {
					break
				}
			}
		}
		svc.hooks.afterLock = enter
		svc.hooks.afterRound = func(context.Context, int) {}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := svc.RunOnce(ctx)
			if !r.LockHeld {
				inside.Add(-1)
			}
			if err != nil {
				t.Errorf("run: %v", err)
			}
			total.Add(r.Deleted)
			flagged.Add(r.Flagged)
		}()
	}
	close(start)
	wg.Wait()
	if maxInside.Load() > 1 {
		t.Fatalf("%d runs held the lock at once", maxInside.Load())
	}
	if total.Load() != 200 || flagged.Load() != 66 {
		t.Fatalf("runs deleted %d and flagged %d in total; want 200 and 66", total.Load(), flagged.Load())
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM (SELECT key_id FROM idempotency_key_reviews GROUP BY key_id, reason HAVING count(*) > 1) d"); n != 0 {
		t.Fatalf("%d keys flagged twice", n)
	}
}

// TestForeignKeySetNull: the article's rides reference keys ON DELETE SET
// NULL; rides survive with the reference cleared.
func TestForeignKeySetNull(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 20)
	young := insertKey(t, pool, keySpec{name: "young", createdAt: dbNow(t, pool)})
	createRides(t, pool, "SET NULL", append(ids[:10:10], young)...)

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 6 })
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Deleted != 20 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id IS NULL"); n != 10 {
		t.Fatalf("%d rides lost their key, want 10", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id = $1", young); n != 1 {
		t.Fatal("the young key's ride lost its reference")
	}
}

// TestForeignKeyRestrict: a RESTRICT reference to a key in the second batch
// stops the run with an error naming the constraint; the first batch stays
// deleted, the run does not loop, and a second run stops at the same place.
func TestForeignKeyRestrict(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 12)
	createRides(t, pool, "RESTRICT", ids[7])

	for run := 1; run <= 2; run++ {
		svc := newService(t, pool, func(s *Settings) { s.BatchSize = 5 })
		res, err := svc.RunOnce(ctx)
		var blocked *BlockedError
		if !errors.As(err, &blocked) {
			t.Fatalf("run %d: error %v, want a BlockedError", run, err)
		}
		if blocked.Constraint != "rides_idempotency_key_id_fkey" || blocked.Table != "rides" {
			t.Fatalf("run %d: blocked by %q on %q", run, blocked.Constraint, blocked.Table)
		}
		if !strings.Contains(err.Error(), `"rides_idempotency_key_id_fkey"`) {
			t.Fatalf("error does not name the constraint: %v", err)
		}
		wantDeleted := int64(5)
		if run == 2 {
			wantDeleted = 0
		}
		if res.Deleted != wantDeleted || res.Complete {
			t.Fatalf("run %d: %+v", run, res)
		}
	}
	for i, id := range ids {
		if got, want := keyExists(t, pool, id), i >= 5; got != want {
			t.Errorf("key %d exists = %v, want %v", i, got, want)
		}
	}
	// Flags of the rolled-back batch were rolled back with it.
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 1 {
		t.Fatalf("%d reviews, want 1 (bulk-3 from the committed batch)", n)
	}
}

func TestCaps(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 10) // 3 unfinished
	before := tableDigest(t, pool)

	for _, c := range []struct {
		name string
		set  func(*Settings)
	}{
		{"max-deletes", func(s *Settings) { s.MaxDeletes = 9 }},
		{"max-flags", func(s *Settings) { s.MaxFlags = 2 }},
	} {
		svc := newService(t, pool, c.set)
		res, err := svc.RunOnce(ctx)
		if !errors.Is(err, ErrCapExceeded) || res.Deleted != 0 {
			t.Fatalf("%s: %+v, %v; want ErrCapExceeded and nothing deleted", c.name, res, err)
		}
		if !strings.Contains(err.Error(), "--"+c.name) {
			t.Errorf("%s: error does not name the flag: %v", c.name, err)
		}
	}
	if tableDigest(t, pool) != before {
		t.Fatal("a refused run changed the tables")
	}
	svc := newService(t, pool, func(s *Settings) { s.MaxDeletes = 10; s.MaxFlags = 3; s.BatchSize = 4 })
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Deleted != 10 || res.Flagged != 3 {
		t.Fatalf("run at the caps: %+v, %v", res, err)
	}
}

func TestMaxRuntimeStopsBeforeNextBatch(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertOldKeys(t, pool, 10)
	svc := newService(t, pool, func(s *Settings) { s.MaxRuntime = time.Nanosecond })
	res, err := svc.RunOnce(context.Background())
	if err != nil || res.Complete || res.StopReason != "max_runtime" || res.Deleted != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
}

// TestStatementTimeoutHalvesBatch: a batch stuck behind a row lock hits
// statement_timeout; the run halves the batch, and gives up with an error
// at the floor instead of looping.
func TestStatementTimeoutHalvesBatch(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 5)
	createRides(t, pool, "SET NULL", ids[0])
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT * FROM rides FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 2 * minBatchSize; s.StatementTimeout = 100 * time.Millisecond })
	res, err := svc.RunOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("want a timeout error, got %v", err)
	}
	if res.BatchTimeouts != 2 || res.FinalBatchSize != minBatchSize || res.Deleted != 0 {
		t.Fatalf("%+v", res)
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	s := Settings{Eligibility: Eligibility{Retention: time.Minute, LockWindow: -1}, BatchSize: 0, StatementTimeout: 0, MaxRuntime: 0, MaxDeletes: -1, Schedule: "every hour"}
	_, err := New(Config{Settings: s})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--retention", "--batch-size", "--statement-timeout", "--lock-window", "--max-runtime", "--max-deletes", "--schedule", "--flagged-by", "pool"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	// --once is the command's flag, not a setting: its rule is the
	// command's, on top of every rule of the settings.
	cmd := Command{Settings: s, Once: true}
	problems := strings.Join(cmd.Check(), "\n")
	for _, want := range []string{"--once and --schedule", "--retention", "--batch-size", "--database-url"} {
		if !strings.Contains(problems, want) {
			t.Errorf("Command.Check lacks %q: %s", want, problems)
		}
	}
}

func TestSummaryIsJSONFriendly(t *testing.T) {
	// The summary's counts are plain fields; make sure Result marshals
	// (the benchmark and any caller may print it).
	if _, err := json.Marshal(&Result{FlaggedByReason: map[string]int64{"x": 1}}); err != nil {
		t.Fatal(err)
	}
}

// TestMaxDeletesDuringRun: keys that cross the horizon while a run goes on
// cannot take it past --max-deletes: the batch that would is rolled back and
// the run exits with the cap's error, keeping the batches before.
func TestMaxDeletesDuringRun(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 10)
	svc := newService(t, pool, func(s *Settings) { s.MaxDeletes = 10; s.BatchSize = 4 })
	svc.hooks.afterRound = func(ctx context.Context, batch int) {
		if batch == 1 {
			if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, request_method, request_params, request_path, recovery_point, user_id, locked_at)
SELECT now() - interval '80 hours', 'late-' || g, 'POST', '{}', '/', 'finished', 1, NULL FROM generate_series(1, 3) g`); err != nil {
				t.Error(err)
			}
		}
	}
	res, err := svc.RunOnce(ctx)
	// Where the run stops depends on how the batches fall around the late
	// keys (they share one created_at); what must hold is that it stops
	// with the cap's error, never past the cap and at most one batch short
	// of it (the batch that would cross it is rolled back whole), and that
	// the count it reports is what left the table.
	if !errors.Is(err, ErrCapExceeded) || res.Deleted > 10 || res.Deleted < 10-4+1 || res.Complete {
		t.Fatalf("%+v, %v", res, err)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 13-res.Deleted {
		t.Fatalf("%d keys left, want %d", n, 13-res.Deleted)
	}
}

// TestDryRunWhileARunHoldsTheLock: a preview does not wait for, or skip
// because of, a real run.
func TestDryRunWhileARunHoldsTheLock(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 3)
	if a, err := lease.Acquire(ctx, pool, LeaseName, "test-holder", time.Hour); err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	svc := newService(t, pool, func(s *Settings) { s.DryRun = true })
	res, err := svc.RunOnce(ctx)
	if err != nil || res.LockHeld || res.Plan == nil || res.Plan.Deletes != 3 || !strings.Contains(dryRunText(t, svc, res), "would delete 3 keys") {
		t.Fatalf("%+v, %v", res, err)
	}
}

// TestRowLockedKeysAreSkipped: keys whose row lock another transaction
// holds (a request in flight with SELECT ... FOR UPDATE; the API inserting
// a ride that references the key, whose foreign key check takes FOR KEY
// SHARE) are never deleted. Their batches are redone in the form that skips
// locked keys, the rest is deleted, and the next run, after the locks are
// gone, takes them too.
func TestRowLockedKeysAreSkipped(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 50) // 16 unfinished: every third
	createRides(t, pool, "SET NULL")
	inFlight, referencing := ids[15], ids[33] // both finished

	txUpdate, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txUpdate.Rollback(ctx) //nolint:errcheck
	if _, err := txUpdate.Exec(ctx, "SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE", inFlight); err != nil {
		t.Fatal(err)
	}
	txRide, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txRide.Rollback(ctx) //nolint:errcheck
	if _, err := txRide.Exec(ctx, "INSERT INTO rides (idempotency_key_id) VALUES ($1)", referencing); err != nil {
		t.Fatal(err)
	}

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10 })
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete || res.LockedBatches != 2 || res.Deleted != 48 || res.Flagged != 16 {
		t.Fatalf("run with two locked keys: %+v", res)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); got != 2 {
		t.Fatalf("%d keys left, want the 2 locked ones", got)
	}
	if !keyExists(t, pool, inFlight) || !keyExists(t, pool, referencing) {
		t.Fatal("a locked key was deleted")
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); got != 16 {
		t.Fatalf("%d reviews, want 16", got)
	}

	if err := txUpdate.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := txRide.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 2 || res.LockedBatches != 0 {
		t.Fatalf("run after the locks are gone: %+v, %v", res, err)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); got != 0 {
		t.Fatalf("%d keys left", got)
	}
	if got := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id IS NULL"); got != 1 {
		t.Fatalf("the committed ride's reference was not cleared: %d rides with NULL", got)
	}
}

// TestBatchesStayBoundedWhenKeysShareCreatedAt: keys with one created_at
// (a bulk import, or requests that began in the same microsecond) are still
// deleted at most --batch-size per batch, counted by the rows left after
// each batch.
func TestBatchesStayBoundedWhenKeysShareCreatedAt(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
SELECT now() - interval '100 hours', 'same-' || g, NULL, 'POST', '{}', '/rides', 'finished', 7
FROM generate_series(1, 25) g`); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 10 })
	var left []int64
	svc.hooks.afterRound = func(context.Context, int) {
		left = append(left, queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"))
	}
	res, err := svc.RunOnce(ctx)
	// The first two batches find their created_at range empty (the bound
	// is that same created_at) and are redone in id order; the last takes
	// the remaining five by range.
	if err != nil || !res.Complete || res.Deleted != 25 || res.OrderedBatches != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	if want := []int64{15, 5, 0}; !slices.Equal(left, want) {
		t.Fatalf("keys left after each batch %v, want %v", left, want)
	}
}

// TestInFlightKeysBeforeTheBoundDoNotEndTheRun: the fast batch counts every
// key toward its bound, in flight or not. When all the keys before the bound
// are in flight it deletes nothing, and the run must still go on to the
// eligible keys after them (the batch is redone in the ordered form), and
// leave the in-flight keys alone.
func TestInFlightKeysBeforeTheBoundDoNotEndTheRun(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	t0 := dbNow(t, pool)
	var inFlight, eligible []int64
	for i := range 6 {
		spec := keySpec{name: fmt.Sprintf("k%d", i), createdAt: t0.Add(-100*time.Hour + time.Duration(i)*time.Second)}
		if i < 3 {
			spec.lockedAt = ptr(t0.Add(-time.Second))
			inFlight = append(inFlight, insertKey(t, pool, spec))
			continue
		}
		eligible = append(eligible, insertKey(t, pool, spec))
	}
	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 2 })
	svc.pinnedNow = &t0
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Complete || res.Deleted != 3 || res.OrderedBatches != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	for _, id := range inFlight {
		if !keyExists(t, pool, id) {
			t.Errorf("in-flight key %d was deleted", id)
		}
	}
	for _, id := range eligible {
		if keyExists(t, pool, id) {
			t.Errorf("eligible key %d was left", id)
		}
	}
}

package enqueuer

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lowwater"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// TestFloorTake: the floor is the lowest id asked for since the last take,
// a take resets it, and only rows the sweep found below both a pending
// notification and what this replica already took count as a gap. No
// database: the floor is pure.
func TestFloorTake(t *testing.T) {
	type op func(f *floor)
	lower := func(id int64) op { return func(f *floor) { f.lower(id) } }
	swept := func(id int64, listening bool) op { return func(f *floor) { f.lowerSwept(id, listening) } }
	untilEmpty := func(f *floor) { f.lowerUntilEmpty() }
	for _, c := range []struct {
		name   string
		ops    []op
		passed int64 // the highest id this replica took
		want   drainSpec
		ok     bool
	}{
		{name: "nothing asked for", passed: 0},
		{name: "notifications 300, 200, 250", ops: []op{lower(300), lower(200), lower(250)}, passed: 1000,
			want: drainSpec{from: 200, gapBelow: fullPass}, ok: true},
		// A swept row below a pending notification, the listener up: rows
		// below the notification and below what was taken are a gap.
		{name: "swept 100, notified 500, passed 400", ops: []op{lower(500), swept(100, true)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: 400}, ok: true},
		{name: "swept 100, notified 300, passed 400", ops: []op{lower(300), swept(100, true)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: 300}, ok: true},
		{name: "swept 100 alone, listening", ops: []op{swept(100, true)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: 400}, ok: true},
		{name: "swept above a notification: the notification's drain", ops: []op{lower(100), swept(300, true)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: fullPass}, ok: true},
		// Not listening (poll-only, or a listener that is down): the sweep
		// is the expected way to find rows, no gap.
		{name: "swept while not listening", ops: []op{swept(100, false)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: fullPass}, ok: true},
		{name: "the lowest sweep decides whether it was listening", ops: []op{swept(200, true), swept(100, false), swept(150, true)}, passed: 400,
			want: drainSpec{from: 100, gapBelow: fullPass}, ok: true},
		// A full pass asked for wins over the sweep.
		{name: "full pass and sweep", ops: []op{swept(100, true), lower(fullPass)}, passed: 400,
			want: drainSpec{from: fullPass, gapBelow: fullPass}, ok: true},
		// --once: full passes until one takes nothing.
		{name: "--once", ops: []op{untilEmpty}, passed: 400,
			want: drainSpec{from: fullPass, gapBelow: fullPass, untilEmpty: true}, ok: true},
		{name: "--once with a notification", ops: []op{lower(5), untilEmpty, lower(7)}, passed: 400,
			want: drainSpec{from: fullPass, gapBelow: fullPass, untilEmpty: true}, ok: true},
	} {
		f := newFloor()
		for _, o := range c.ops {
			o(f)
		}
		spec, ok := f.take(c.passed)
		if ok != c.ok || spec != c.want {
			t.Errorf("%s: take = %+v %v, want %+v %v", c.name, spec, ok, c.want, c.ok)
		}
		if spec, ok := f.take(c.passed); ok {
			t.Errorf("%s: the floor was not reset by the take: %+v", c.name, spec)
		}
	}
}

// TestNextLowWater: the sweep's mark, one sweep at a time, without a
// database. It rises to min(lowest id, last value + 1) once every lock
// holder of the last value read earlier has ended, never while one is
// left, never falls through the candidate, is off without a usable
// sequence, resets when the sequence went backwards, and a full sweep
// reads from the start and lowers it to an explicit id below it.
func TestNextLowWater(t *testing.T) {
	ptr := func(v int64) *int64 { return &v }
	cand := func(last int64, holders ...string) *markCandidate {
		return &markCandidate{last: last, holders: holders}
	}
	reading := func(last int64, holders ...string) seqReading {
		return seqReading{usable: true, markCandidate: markCandidate{last: last, holders: holders}}
	}
	for _, c := range []struct {
		name     string
		st       markState
		seq      seqReading
		full     bool
		low      *int64 // what the read returns
		wantFrom int64  // where the read starts
		want     markState
	}{
		{name: "no usable sequence", st: markState{mark: 50, cand: cand(60)}, seq: seqReading{}, low: ptr(70),
			wantFrom: fullPass, want: markState{mark: fullPass}},
		{name: "first sweep: a candidate, no mark yet", st: markState{mark: fullPass}, seq: reading(100, "3/7"), low: ptr(90),
			wantFrom: fullPass, want: markState{mark: fullPass, cand: cand(100, "3/7")}},
		{name: "a holder is left: nothing moves", st: markState{mark: fullPass, cand: cand(100, "3/7", "4/2")}, seq: reading(120, "4/2"), low: ptr(90),
			wantFrom: fullPass, want: markState{mark: fullPass, cand: cand(100, "3/7", "4/2")}},
		{name: "holders ended, table empty: last value + 1", st: markState{mark: fullPass, cand: cand(100, "3/7")}, seq: reading(120, "5/1"), low: nil,
			wantFrom: fullPass, want: markState{mark: 101, cand: cand(120, "5/1")}},
		{name: "holders ended, a row below the last value: that row", st: markState{mark: 20, cand: cand(100)}, seq: reading(120), low: ptr(90),
			wantFrom: 20, want: markState{mark: 90, cand: cand(120)}},
		{name: "never below the mark it had", st: markState{mark: 150, cand: cand(100)}, seq: reading(160), low: ptr(155),
			wantFrom: 150, want: markState{mark: 150, cand: cand(160)}},
		{name: "the sequence went backwards", st: markState{mark: 150, cand: cand(200)}, seq: reading(10), low: ptr(5),
			wantFrom: fullPass, want: markState{mark: fullPass, cand: cand(10)}},
		{name: "a full sweep finds an explicit id below the mark", st: markState{mark: 150, cand: cand(160, "9/9")}, seq: reading(170, "9/9"), full: true, low: ptr(-5),
			wantFrom: fullPass, want: markState{mark: -5, cand: cand(160, "9/9")}},
		{name: "a full sweep without rows below the mark", st: markState{mark: 150, cand: cand(160, "9/9")}, seq: reading(170, "9/9"), full: true, low: ptr(165),
			wantFrom: fullPass, want: markState{mark: 150, cand: cand(160, "9/9")}},
	} {
		var from int64
		got, low, err := nextMark(c.st, c.seq, c.full, func(f int64) (*int64, error) { from = f; return c.low, nil })
		if err != nil || low != c.low {
			t.Errorf("%s: low %v, err %v", c.name, low, err)
		}
		if from != c.wantFrom || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: read from %d, state %+v (candidate %+v); want from %d, %+v (candidate %+v)", c.name, from, got, got.cand, c.wantFrom, c.want, c.want.cand)
		}
	}
	// A failed read keeps what the reading decided alone.
	failed := errors.New("connection lost")
	got, _, err := nextMark(markState{mark: 150, cand: cand(200)}, reading(10), false, func(int64) (*int64, error) { return nil, failed })
	if !errors.Is(err, failed) || got.mark != fullPass || got.cand != nil {
		t.Errorf("failed read after the sequence went backwards: %+v, %v", got, err)
	}
}

// TestCursorTilesTheIDs: batches of a drain claim consecutive ranges, and
// a full batch whose ids ran past its range moves the cursor past them.
func TestCursorTilesTheIDs(t *testing.T) {
	c := &cursor{next: 100}
	if a, b := c.claim(10), c.claim(10); a != 100 || b != 110 {
		t.Fatalf("claims %d, %d", a, b)
	}
	c.passed(105) // behind the cursor: no change
	if n := c.claim(10); n != 120 {
		t.Fatalf("claim after passed(105): %d", n)
	}
	c.passed(200)
	if n := c.claim(10); n != 201 {
		t.Fatalf("claim after passed(200): %d", n)
	}
}

// listenTo opens a connection listening on the staged_jobs channel.
func listenTo(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// nextPayload waits for the next notification (the deadline only bounds a
// hung test).
func nextPayload(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("waiting for a notification: %v", err)
	}
	return n.Payload
}

// TestNotificationCarriesTheLowestInsertedID: the trigger of migration
// 00015 sends, per committed transaction, the lowest id of each statement
// that inserted below what the transaction already notified, and nothing
// for a statement that inserted nothing.
func TestNotificationCarriesTheLowestInsertedID(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	l := listenTo(t, pool)
	marker := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, NotifyChannel); err != nil {
			t.Fatal(err)
		}
		if p := nextPayload(t, l); p != "marker" {
			t.Fatalf("got notification %q, want only the marker", p)
		}
	}

	var low int64
	if err := pool.QueryRow(ctx, `WITH i AS (INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' FROM generate_series(1, 3) RETURNING id)
SELECT min(id) FROM i`).Scan(&low); err != nil {
		t.Fatal(err)
	}
	if p := nextPayload(t, l); p != strconv.FormatInt(low, 10) {
		t.Fatalf("3-row insert: payload %q, want %d", p, low)
	}

	// Two statements in one transaction: the second's ids are above the
	// first's, which is the only notification. A statement inserting ids
	// below it (explicit ids) notifies again. A statement inside a
	// rolled-back savepoint leaves neither its notification nor its memory.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT a; INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}'); ROLLBACK TO SAVEPOINT a`); err != nil {
		t.Fatal(err)
	}
	var first, second int64
	if err := tx.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}') RETURNING id`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}') RETURNING id`).Scan(&second); err != nil {
		t.Fatal(err)
	}
	explicit := low - 1 // below everything the sequence handed out since
	if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args) VALUES ($1, 'k', '{}')`, explicit); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	got = append(got, nextPayload(t, l), nextPayload(t, l))
	want := []string{strconv.FormatInt(first, 10), strconv.FormatInt(explicit, 10)}
	if !slices.Equal(got, want) || second <= first {
		t.Fatalf("transaction of 3 statements: payloads %q, want %q", got, want)
	}
	marker()

	// Inserting nothing notifies nothing.
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' WHERE false`); err != nil {
		t.Fatal(err)
	}
	marker()
	// A rolled-back transaction notifies nothing.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	marker()
}

// recordDrains records the spec of every drain s starts.
func recordDrains(s *Service) func() []drainSpec {
	var mu sync.Mutex
	var specs []drainSpec
	s.hooks.drainStarted = func(d drainSpec) {
		mu.Lock()
		specs = append(specs, d)
		mu.Unlock()
	}
	return func() []drainSpec {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(specs)
	}
}

// lateLowID opens a transaction that stages one row and leaves it
// uncommitted, then commits 25 rows with higher ids and waits for them to be
// moved. It returns the late row's id and the open transaction.
func lateLowID(t *testing.T, pool *pgxpool.Pool) (int64, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { late.Rollback(context.Background()) }) //nolint:errcheck
	var lateID int64
	if err := late.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('late', '{}') RETURNING id`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'early', '{}' FROM generate_series(1, 25)`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "the 25 higher ids to move", func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job") == 25
	})
	if ids := stagedIDsInRiver(t, pool); slices.Contains(ids, lateID) || ids[0] <= lateID {
		t.Fatalf("before the late commit: jobs %v, late id %d", ids, lateID)
	}
	return lateID, late
}

// TestLateLowIDIsMovedByItsNotification: a transaction holding a low id
// commits after rows with higher ids were moved. Its own notification
// names its id, and the drain it wakes starts there: no poll, no sweep and
// no full pass is involved.
func TestLateLowIDIsMovedByItsNotification(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval = time.Hour })
	drains := recordDrains(s)
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)

	lateID, late := lateLowID(t, pool)
	reconnects := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("reconnect"))
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	movedOnce(t, pool, lateID, "the late row")
	// A batch counts after its commit: stopped, every count is in.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(drains(), drainSpec{from: lateID, gapBelow: fullPass}) {
		t.Fatalf("no drain started at the late id %d: %+v", lateID, drains())
	}
	if testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("poll")) != 0 ||
		testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("reconnect")) != reconnects {
		t.Fatal("a poll or reconnect happened; the move is not attributable to the notification")
	}
	for _, r := range GapReasons {
		if v := testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(r)); v != 0 {
			t.Fatalf("gap %s = %v", r, v)
		}
	}
}

// TestLateLowIDIsMovedWithoutNotifications: the same with --poll-only:
// the sweep finds the late row within the poll interval.
func TestLateLowIDIsMovedWithoutNotifications(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.PollOnly, s.SweepInterval = true, 50*time.Millisecond })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck

	lateID, late := lateLowID(t, pool)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	movedOnce(t, pool, lateID, "the late row")
	// A batch counts after its commit: stopped, every count is in.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("notify")); n != 0 {
		t.Fatalf("%v notify wake-ups with --poll-only", n)
	}
	// Without a listener the sweep is how rows are found: not a gap.
	if v := testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(GapSwept)); v != 0 {
		t.Fatalf("gap swept = %v with --poll-only", v)
	}
}

// TestLostNotificationIsSweptAndCounted: the late row's notification is
// lost while the listener stays up. The sweep finds the row within the
// poll interval, and the gap is counted.
func TestLostNotificationIsSweptAndCounted(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval = 100 * time.Millisecond })
	var lost sync.Map // payloads to lose
	s.hooks.dropNotification = func(p string) bool { _, ok := lost.Load(p); return ok }
	s.signals.listenerUp.Init(t)
	s.signals.passed.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	// The start's full pass must be over before the late row exists: on a
	// loaded machine it could otherwise be the pass that moves the row,
	// which is no gap.
	s.signals.passed.WaitOrTimeout(t)

	lateID, late := lateLowID(t, pool)
	lost.Store(strconv.FormatInt(lateID, 10), true)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sweptOnce(t, s, pool, lateID, "the late row")
}

// movedOnce waits until the row id is in River and checks River holds the
// 26 rows these tests stage (the late or locked row and 25 others) once
// each.
func movedOnce(t *testing.T, pool *pgxpool.Pool, id int64, what string) {
	t.Helper()
	testwait.Until(t, 2*time.Minute, what+" to move", func() bool {
		return slices.Contains(stagedIDsInRiver(t, pool), id)
	})
	if ids := stagedIDsInRiver(t, pool); len(ids) != 26 || len(slices.Compact(ids)) != 26 {
		t.Fatalf("River holds %v, want 26 distinct jobs", ids)
	}
}

// sweptOnce is movedOnce, and checks that the sweep's gap was counted
// exactly once. The batch counts its gap after its commit, so the
// row can be seen in River a moment before the counter moves: it waits for
// the count, then checks it is exactly the one row.
func sweptOnce(t *testing.T, s *Service, pool *pgxpool.Pool, id int64, what string) {
	t.Helper()
	movedOnce(t, pool, id, what)
	testwait.Until(t, 2*time.Minute, "the counted gap", func() bool {
		return testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(GapSwept)) >= 1
	})
	if v := testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(GapSwept)); v != 1 {
		t.Fatalf("gap swept = %v, want 1 (%s)", v, what)
	}
}

// TestRowsAnotherReplicaRolledBackAreSwept: a row locked by another
// replica's batch is skipped while later rows move; that batch rolls back
// and nothing notifies. The sweep moves the row and counts it as a gap.
func TestRowsAnotherReplicaRolledBackAreSwept(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var lockedID int64
	if err := pool.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('locked', '{}') RETURNING id`).Scan(&lockedID); err != nil {
		t.Fatal(err)
	}
	other, err := pool.Begin(ctx) // the other replica's batch
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck
	if _, err := other.Exec(ctx, `SELECT id FROM staged_jobs WHERE id = $1 FOR UPDATE`, lockedID); err != nil {
		t.Fatal(err)
	}

	s := newService(t, pool, func(s *Settings) { s.SweepInterval = 100 * time.Millisecond })
	s.signals.listenerUp.Init(t)
	s.signals.swept.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	// A sweep that began before the listener was up finds the locked row
	// as one committed while nobody listened, which is no gap; on a loaded
	// machine it can end late enough for the drain it asks for to be the
	// one that moves the released row. Sweeps run one after another, so
	// once one that began listening has ended, none of those is left.
	for !s.signals.swept.WaitOrTimeout(t) {
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'later', '{}' FROM generate_series(1, 25)`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "the 25 later rows to move", func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job") == 25
	})
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	sweptOnce(t, s, pool, lockedID, "the released row")
}

// TestNotificationWithoutFloorIsAFullPass: a notification with no id in it
// (the trigger before migration 00015) makes the next drain a full pass,
// and is counted.
func TestNotificationWithoutFloorIsAFullPass(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval = time.Hour })
	drains := recordDrains(s)
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	// The drain that moves this row took the reconnect's full pass with it:
	// from here on only notifications wake the service.
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "the row to move", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 1 })
	before := len(drains())
	if _, err := pool.Exec(ctx, `SELECT pg_notify($1, '')`, NotifyChannel); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "the counted gap", func() bool {
		return testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(GapNoFloor)) == 1
	})
	testwait.Until(t, 2*time.Minute, "a full pass", func() bool {
		return slices.Contains(drains()[before:], drainSpec{from: fullPass, gapBelow: fullPass})
	})
}

// takeCost runs takeSQL from `from` under EXPLAIN (ANALYZE, BUFFERS) in a
// transaction begun as a move transaction is, rolls it back, and returns
// what the take read: entries of staged_jobs_pkey (the index's
// tuples-returned counter of this backend, read before and after in the
// same transaction, so nothing else is counted), shared buffers (hit or
// read), and the rows it took.
func takeCost(t *testing.T, pool *pgxpool.Pool, from int64) (entries, buffers, rows int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	const entriesSQL = `SELECT pg_stat_get_xact_tuples_returned('staged_jobs_pkey'::regclass)`
	var before, after int64
	if err := tx.QueryRow(ctx, entriesSQL).Scan(&before); err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+takeSQL, takeArgs(from, DefaultSettings().BatchSize)).Scan(&out); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, entriesSQL).Scan(&after); err != nil {
		t.Fatal(err)
	}
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
			Rows int64 `json:"Actual Rows"`
		}
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain output %s: %v", out, err)
	}
	return after - before, plans[0].Plan.Hit + plans[0].Plan.Read, plans[0].Plan.Rows
}

// TestTakeCostDoesNotGrowWithDeadRows is issue 16's failure, structurally:
// with a REPEATABLE READ snapshot held open, every moved row stays behind
// as a dead entry nothing can clean. A take from the floor a notification
// gives reads only the new rows' index entries, and the same number of
// buffers, after 21,100 dead rows as after 1,000; a take from the start of
// the index (what every batch did before, and what a full pass still does)
// reads every dead entry, which shows the dead rows are really there.
func TestTakeCostDoesNotGrowWithDeadRows(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	held, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx) //nolint:errcheck
	// The first statement takes the transaction's snapshot.
	if _, err := held.Exec(ctx, `SELECT count(*) FROM staged_jobs`); err != nil {
		t.Fatal(err)
	}
	l := listenTo(t, pool)
	s := newService(t, pool)

	// stage stages n rows in one statement, checks the notification names
	// their lowest id, and returns it; move drains from it as a notified
	// drain does.
	stage := func(n int) int64 {
		t.Helper()
		var low int64
		if err := pool.QueryRow(ctx, `WITH i AS (INSERT INTO staged_jobs (job_name, job_args)
SELECT 'send_ride_receipt', jsonb_build_object('ride_id', g, 'email', 'rider' || g || '@example.com') FROM generate_series(1, $1) g RETURNING id)
SELECT min(id) FROM i`, n).Scan(&low); err != nil {
			t.Fatal(err)
		}
		if p := nextPayload(t, l); p != strconv.FormatInt(low, 10) {
			t.Fatalf("notification %q for a statement whose lowest id is %d", p, low)
		}
		return low
	}
	move := func(from int64, n int) {
		t.Helper()
		res, err := s.drain(ctx, lifecycle.Stop{}, drainSpec{from: from, gapBelow: fullPass})
		if err != nil {
			t.Fatal(err)
		}
		if res.Moved != n {
			t.Fatalf("drain from %d moved %d, want %d", from, res.Moved, n)
		}
	}
	type cost struct{ entries, buffers int64 }
	measure := func() (fromFloor, fromStart cost) {
		t.Helper()
		low := stage(100)
		var rows, fullRows int64
		fromFloor.entries, fromFloor.buffers, rows = takeCost(t, pool, low)
		fromStart.entries, fromStart.buffers, fullRows = takeCost(t, pool, fullPass)
		if rows != 100 || fullRows != 100 {
			t.Fatalf("takes found %d and %d rows, want 100", rows, fullRows)
		}
		move(low, 100)
		return fromFloor, fromStart
	}

	move(stage(1000), 1000)
	floor1k, full1k := measure()
	move(stage(20_000), 20_000)
	floor21k, full21k := measure()
	t.Logf("a take of 100 rows from the floor: %d index entries, %d buffers with 1,000 dead rows; %d entries, %d buffers with 21,100",
		floor1k.entries, floor1k.buffers, floor21k.entries, floor21k.buffers)
	t.Logf("the same take from the start of the index: %d entries, %d buffers; %d entries, %d buffers",
		full1k.entries, full1k.buffers, full21k.entries, full21k.buffers)
	// The control: the snapshot really kept the dead rows, and a take from
	// the start reads every one of their index entries.
	if full1k.entries < 1100 || full21k.entries < 21_100 {
		t.Fatalf("control: a take from the start read %d and %d index entries; the held snapshot kept no dead rows", full1k.entries, full21k.entries)
	}
	// From the floor: the 100 new rows' entries, whatever lies below.
	if floor1k.entries > 100 || floor21k.entries > 100 {
		t.Fatalf("a take from the floor read %d index entries with 1,000 dead rows and %d with 21,100; want the 100 staged rows' only", floor1k.entries, floor21k.entries)
	}
	if floor21k.buffers > floor1k.buffers+floor1k.buffers/10 {
		t.Fatalf("a take from the floor read %d buffers with 21,100 dead rows, %d with 1,000: it grows with the dead rows", floor21k.buffers, floor1k.buffers)
	}
}

// TestSweepLowWaterMark: the sweep's mark rises past moved rows once every
// transaction that could still hold a lower id has ended, never past an id
// an open transaction holds, and every lowwater.FullEvery-th sweep still reads
// from the start of the index (a row with an explicit id below the mark).
func TestSweepLowWaterMark(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool)
	sweep := func() *int64 {
		t.Helper()
		low, err := s.sweepOnce(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		return low
	}
	stageAndMove := func(n int) (last int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `WITH i AS (INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' FROM generate_series(1, $1) RETURNING id)
SELECT max(id) FROM i`, n).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if _, err := s.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return last
	}
	mark := func() int64 { return s.lw.mark.Load() }

	sweep()
	last := stageAndMove(100)
	sweep()
	if low := sweep(); low != nil || mark() != last+1 {
		t.Fatalf("after moving ids up to %d: mark %d, lowest %v", last, mark(), low)
	}

	// An open transaction holding an id: later ids move, the mark stays
	// at or below the held id however many sweeps pass.
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx) //nolint:errcheck
	var lateID int64
	if err := late.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('late', '{}') RETURNING id`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	last = stageAndMove(50)
	for range 3 {
		if low := sweep(); low != nil || mark() > lateID {
			t.Fatalf("with id %d uncommitted: mark %d, lowest %v", lateID, mark(), low)
		}
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if low := sweep(); low == nil || *low != lateID || mark() > lateID {
		t.Fatalf("after id %d committed: lowest %v, mark %d", lateID, low, mark())
	}
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	sweep()
	if sweep(); mark() != last+1 {
		t.Fatalf("after moving everything up to %d: mark %d", last, mark())
	}

	// An explicit id below the mark is not what the mark promises: only
	// the periodic sweep from the start finds it.
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args) VALUES (-5, 'explicit', '{}')`); err != nil {
		t.Fatal(err)
	}
	for low := sweep(); low == nil; low = sweep() {
		if s.lw.reads.Done > 2*lowwater.FullEvery {
			t.Fatalf("%d sweeps did not find id -5", s.lw.reads.Done)
		}
	}
	// The sweep that found it was a full one: read number Done-1 (from 0).
	if found := s.lw.reads.Done - 1; found%lowwater.FullEvery != 0 || mark() > -5 {
		t.Fatalf("id -5 found by sweep %d (want a multiple of %d), mark %d", found, lowwater.FullEvery, mark())
	}
}

package runhistory

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func lastRun(t *testing.T, pool *pgxpool.Pool) Run {
	t.Helper()
	runs, err := LastRuns(context.Background(), pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 {
		t.Fatalf("the run history is empty")
	}
	return runs[0]
}

// inTx runs f in a transaction, committed when f returns nil.
func inTx(t *testing.T, pool *pgxpool.Pool, f func(tx pgx.Tx) error) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), pool, f)
}

// TestARunsRecord: a run's row from its start through its batches (a
// batch rolled back counts nothing) to its end, on the database clock; a
// run that never held the lease is one finished row; only a complete run
// is a success.
func TestARunsRecord(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if last, err := LastSuccess(ctx, pool); err != nil || last != nil {
		t.Fatalf("LastSuccess of an empty history = %v, %v; want none", last, err)
	}
	if runs, err := LastRuns(ctx, pool, 5); err != nil || runs == nil || len(runs) != 0 {
		t.Fatalf("LastRuns of an empty history = %#v, %v; want an empty list", runs, err)
	}

	var before time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	run, err := Start(ctx, pool, 2*time.Second, ModeOnce, "reaper/test/1/aa", Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var after time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&after); err != nil {
		t.Fatal(err)
	}
	// No lease row for the holder: a row without an end reads as
	// interrupted. started_at is two seconds before the insert, by the
	// database clock.
	if r := lastRun(t, pool); r.ID != run || r.FinishedAt != nil || r.Result != ResultInterrupted || r.Mode != ModeOnce ||
		r.StartedAt.Before(before.Add(-2*time.Second)) || r.StartedAt.After(after.Add(-2*time.Second)) {
		t.Fatalf("a started run reads as %+v; the insert was between %v and %v", r, before, after)
	}
	if err := inTx(t, pool, func(tx pgx.Tx) error { return RecordBatch(ctx, tx, run, 7, 2) }); err != nil {
		t.Fatal(err)
	}
	rolledBack := errors.New("rolled back")
	if err := inTx(t, pool, func(tx pgx.Tx) error {
		if err := RecordBatch(ctx, tx, run, 100, 100); err != nil {
			return err
		}
		return rolledBack
	}); !errors.Is(err, rolledBack) {
		t.Fatal(err)
	}
	if r := lastRun(t, pool); r.Deleted != 7 || r.Flagged != 2 {
		t.Fatalf("after a committed batch of 7/2 and a rolled-back one: %+v", r)
	}
	if err := inTx(t, pool, func(tx pgx.Tx) error {
		return End(ctx, tx, run, Outcome{Result: ResultComplete, Deleted: 7, Flagged: 2})
	}); err != nil {
		t.Fatal(err)
	}
	r := lastRun(t, pool)
	if r.Result != ResultComplete || r.FinishedAt == nil || r.FinishedAt.Before(r.StartedAt) || r.Error != "" || r.Holder != "reaper/test/1/aa" {
		t.Fatalf("the ended run reads as %+v", r)
	}
	last, err := LastSuccess(ctx, pool)
	if err != nil || last == nil || !last.Equal(*r.FinishedAt) {
		t.Fatalf("LastSuccess = %v, %v; want the run's end %v", last, err, r.FinishedAt)
	}

	if err := RecordUnleased(ctx, pool, time.Second, ModeSchedule, "reaper/test/2/bb", Outcome{Result: ResultLockHeld}); err != nil {
		t.Fatal(err)
	}
	if r := lastRun(t, pool); r.Result != ResultLockHeld || r.Mode != ModeSchedule || r.FinishedAt == nil || r.Deleted != 0 || r.Holder != "reaper/test/2/bb" {
		t.Fatalf("the run that found the lease held reads as %+v", r)
	}
	if err := RecordUnleased(ctx, pool, 0, ModeOnce, "reaper/test/3/cc", Outcome{Result: ResultError, Err: fmt.Errorf("reaper: %w", errors.New("the database went away"))}); err != nil {
		t.Fatal(err)
	}
	if r := lastRun(t, pool); r.Result != ResultError || r.Error != "reaper: the database went away" {
		t.Fatalf("the failed run reads as %+v", r)
	}
	// Neither of the later runs is a success.
	if again, err := LastSuccess(ctx, pool); err != nil || again == nil || !again.Equal(*last) {
		t.Fatalf("LastSuccess after a lock_held and an error run = %v, %v; want still %v", again, err, last)
	}
}

// TestRunningOrInterrupted: a row without an end is running while its
// holder holds a live reaper lease and has begun no later run, interrupted
// otherwise; runs come newest first.
func TestRunningOrInterrupted(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder) VALUES
    (now() - interval '5 hours', NULL, 'once', NULL, 1, 0, NULL, 'reaper/pod-d/1/dd'),
    (now() - interval '4 hours', now() - interval '4 hours' + interval '3 seconds', 'once', 'complete', 30, 10, NULL, 'reaper/pod-a/1/aa'),
    (now() - interval '3 hours', NULL, 'once', NULL, 20, 4, NULL, 'reaper/pod-c/1/cc'),
    (now() - interval '2 hours', NULL, 'once', NULL, 3, 0, NULL, 'reaper/pod-e/1/ee'),
    (now() - interval '1 minute', NULL, 'schedule', NULL, 5, 0, NULL, 'reaper/pod-d/1/dd');
INSERT INTO idemd_leases (name, holder, acquired_at, renewed_at, expires_at) VALUES
    ('reaper', 'reaper/pod-d/1/dd', now(), now(), now() + interval '1 hour');
-- pod-e holds a lease of another name, and an expired one would not count either.
INSERT INTO idemd_leases (name, holder, acquired_at, renewed_at, expires_at) VALUES
    ('db-stats', 'reaper/pod-e/1/ee', now(), now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	runs, err := LastRuns(ctx, pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s %s %d/%d", r.Mode, r.Result, r.Deleted, r.Flagged))
	}
	want := []string{
		"schedule running 5/0",  // its holder holds the lease
		"once interrupted 3/0",  // its holder holds another lease
		"once interrupted 20/4", // its holder holds none
		"once complete 30/10",
		"once interrupted 1/0", // its holder holds the lease, but began a later run
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("runs %v, want %v", got, want)
	}
	if runs, err := LastRuns(ctx, pool, 2); err != nil || len(runs) != 2 || runs[0].Mode != ModeSchedule {
		t.Fatalf("LastRuns(2) = %+v, %v", runs, err)
	}
}

// TestHistoryIsBounded: each run's end keeps the newest 1000 runs of the
// last 30 days and deletes the rest.
func TestHistoryIsBounded(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, holder)
SELECT now() - interval '1 day' + g * interval '1 second', now() - interval '1 day' + g * interval '1 second', 'once', 'complete', 'old-runs'
FROM generate_series(1, $1::int + 5) g`, keep); err != nil {
		t.Fatal(err)
	}
	newest := queryInt(t, pool, "SELECT max(id) FROM idemd_reaper_runs")
	aRun := func() {
		t.Helper()
		run, err := Start(ctx, pool, 0, ModeOnce, "reaper/test/1/aa", Settings{})
		if err != nil {
			t.Fatal(err)
		}
		if err := inTx(t, pool, func(tx pgx.Tx) error { return End(ctx, tx, run, Outcome{Result: ResultComplete}) }); err != nil {
			t.Fatal(err)
		}
	}
	aRun()
	// The run's own row and the newest 999 before it.
	if n, oldest := queryInt(t, pool, "SELECT count(*) FROM idemd_reaper_runs"), queryInt(t, pool, "SELECT min(id) FROM idemd_reaper_runs"); n != keep || oldest != newest-keep+2 {
		t.Fatalf("%d runs kept from id %d; want %d from id %d", n, oldest, keep, newest-keep+2)
	}

	// Runs older than 30 days go, however few there are.
	if _, err := pool.Exec(ctx, `UPDATE idemd_reaper_runs SET started_at = now() - interval '31 days' WHERE id IN (
    SELECT id FROM idemd_reaper_runs WHERE holder = 'old-runs' ORDER BY id DESC LIMIT 10)`); err != nil {
		t.Fatal(err)
	}
	aRun()
	if n := queryInt(t, pool, "SELECT count(*) FROM idemd_reaper_runs WHERE started_at < now() - interval '30 days'"); n != 0 {
		t.Fatalf("%d runs older than 30 days kept", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idemd_reaper_runs"); n != keep-10 {
		t.Fatalf("%d runs kept, want %d (1000, minus the 10 too old, with the new run's row in place of the oldest)", n, keep-10)
	}
}

// TestARunRecordsItsSettings: a run records the retention and lock window
// it deletes by, and LastSettings reads the newest run's, skipping runs
// that recorded none (a reaper of an older release on this schema); none
// recorded is nil.
func TestARunRecordsItsSettings(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if rec, err := LastSettings(ctx, pool); err != nil || rec != nil {
		t.Fatalf("LastSettings of an empty history = %+v, %v; want none", rec, err)
	}
	old, err := Start(ctx, pool, 0, ModeOnce, "reaper/test/1/aa", Settings{Retention: 96 * time.Hour, LockWindow: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run, err := Start(ctx, pool, 0, ModeSchedule, "reaper/test/1/bb", Settings{Retention: 90 * time.Minute, LockWindow: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, pool, 0, ModeOnce, "reaper/test/1/cc", Settings{}); err != nil {
		t.Fatal(err)
	}
	rec, err := LastSettings(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if rec == nil || rec.Run != run || rec.Retention != 90*time.Minute || rec.LockWindow != 90*time.Second {
		t.Fatalf("LastSettings = %+v; want run %d's 1h30m0s and 1m30s (not run %d's, older, nor the newest, which recorded none)", rec, run, old)
	}
}

// TestStartBeforeMigration31: on a schema without migration 00031's
// columns, which the reaper still runs on, a run is recorded without its
// settings, and LastSettings reads none.
func TestStartBeforeMigration31(t *testing.T) {
	url := dbtest.NewDatabase(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `ALTER TABLE idemd_reaper_runs DROP COLUMN retention, DROP COLUMN lock_window`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	run, err := Start(ctx, pool, 0, ModeOnce, "reaper/test/1/aa", Settings{Retention: time.Hour, LockWindow: time.Minute})
	if err != nil {
		t.Fatalf("Start on a schema before 00031: %v", err)
	}
	if r := lastRun(t, pool); r.ID != run {
		t.Fatalf("the newest run is %d, want %d", r.ID, run)
	}
	if rec, err := LastSettings(ctx, pool); err != nil || rec != nil {
		t.Fatalf("LastSettings before 00031 = %+v, %v; want none", rec, err)
	}
}

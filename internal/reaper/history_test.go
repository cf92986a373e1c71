package reaper

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/idemd/idemd/internal/runhistory"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// lastRun is the newest run of the history.
func lastRun(t *testing.T, pool *pgxpool.Pool) runhistory.Run {
	t.Helper()
	runs, err := runhistory.LastRuns(context.Background(), pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 {
		t.Fatalf("the run history is empty")
	}
	return runs[0]
}

// TestRunHistoryRecordsARun: a run leaves one row with its mode, result,
// holder, start and end, and the counts of what it did, checked against
// the tables themselves.
func TestRunHistoryRecordsARun(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 30) // 10 unfinished
	insertKey(t, pool, keySpec{name: "young", createdAt: dbNow(t, pool)})
	keysBefore := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys")
	before := dbNow(t, pool)

	svc := newService(t, pool, func(s *Settings) { s.BatchSize = 7 })
	if _, err := svc.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	deleted := keysBefore - queryInt(t, pool, "SELECT count(*) FROM idempotency_keys")
	flagged := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews")
	if n := queryInt(t, pool, "SELECT count(*) FROM idemd_reaper_runs"); n != 1 {
		t.Fatalf("%d rows in the run history, want 1", n)
	}
	r := lastRun(t, pool)
	if r.Mode != runhistory.ModeOnce || r.Result != runhistory.ResultComplete || r.Deleted != deleted || r.Flagged != flagged || r.Error != "" || r.Holder != svc.holder {
		t.Fatalf("run recorded as %+v; the tables say %d deleted, %d flagged", r, deleted, flagged)
	}
	if deleted != 30 || flagged != 10 {
		t.Fatalf("the run deleted %d and flagged %d, want 30 and 10", deleted, flagged)
	}
	if r.FinishedAt == nil || r.StartedAt.Before(before) || r.FinishedAt.Before(r.StartedAt) {
		t.Fatalf("run started %v and finished %v; the test began at %v", r.StartedAt, r.FinishedAt, before)
	}
	last, err := runhistory.LastSuccess(ctx, pool)
	if err != nil || last == nil || !last.Equal(*r.FinishedAt) {
		t.Fatalf("LastSuccess = %v, %v; want the run's end %v", last, err, r.FinishedAt)
	}
}

// TestRunHistoryRecordsFailures: a run refused by a cap and one stopped by
// a foreign key record result error with the error they logged, and the
// counts of the batches they committed; neither is a success.
func TestRunHistoryRecordsFailures(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	ids := insertOldKeys(t, pool, 12)

	capped := newService(t, pool, func(s *Settings) { s.MaxDeletes = 5 })
	if _, err := capped.RunOnce(ctx); !errors.Is(err, ErrCapExceeded) {
		t.Fatalf("capped run: %v", err)
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultError || !strings.Contains(r.Error, "--max-deletes") || r.Deleted != 0 || r.FinishedAt == nil {
		t.Fatalf("the capped run is recorded as %+v", r)
	}

	createRides(t, pool, "RESTRICT", ids[7])
	blocked := newService(t, pool, func(s *Settings) { s.BatchSize = 5 })
	if _, err := blocked.RunOnce(ctx); err == nil {
		t.Fatal("the blocked run succeeded")
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultError || !strings.Contains(r.Error, "rides_idempotency_key_id_fkey") || r.Deleted != 5 || r.Flagged != 1 {
		t.Fatalf("the blocked run is recorded as %+v", r)
	}
	if last, err := runhistory.LastSuccess(ctx, pool); err != nil || last != nil {
		t.Fatalf("LastSuccess after two failed runs = %v, %v; want none", last, err)
	}
}

// TestRunHistoryWhileARunHoldsTheLease: the run holding the lease reads as
// running until its end; a run that found the lease held is recorded as
// lock_held.
func TestRunHistoryWhileARunHoldsTheLease(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 9)
	first := newService(t, pool, nil)
	locked, release := make(chan struct{}), make(chan struct{})
	first.hooks.afterLock = func(context.Context) { close(locked); <-release }
	done := make(chan error, 1)
	go func() { _, err := first.RunOnce(ctx); done <- err }()
	<-locked
	if r := lastRun(t, pool); r.Result != runhistory.ResultRunning || r.FinishedAt != nil || r.Holder != first.holder {
		t.Fatalf("the run holding the lease reads as %+v", r)
	}
	second := newService(t, pool, nil)
	if res, err := second.RunOnce(ctx); err != nil || !res.LockHeld {
		t.Fatalf("second run: %+v, %v", res, err)
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultLockHeld || r.Holder != second.holder || r.Deleted != 0 || r.FinishedAt == nil {
		t.Fatalf("the run that found the lease held reads as %+v", r)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	runs, err := runhistory.LastRuns(ctx, pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[1].Holder != first.holder || runs[1].Result != runhistory.ResultComplete || runs[1].Deleted != 9 {
		t.Fatalf("history %+v; want the lock_held run, then the first run complete with 9 keys", runs)
	}
}

// TestScheduleRecordsItsRuns: a --schedule reaper's runs are in the
// history in mode schedule. (The history's last success, whichever process
// ran it, is exported by internal/dbstats, not by the reaper.)
func TestScheduleRecordsItsRuns(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	s := testSettings()
	s.Schedule = "@hourly"
	svc, err := New(Config{Settings: s, Pool: pool, Logger: zaptest.NewLogger(t), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	svc.schedule = &dueOnce{}
	svc.signals.passed.Init(t)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if res := svc.signals.passed.WaitOrTimeout(t); !res.Complete {
		t.Fatalf("scheduled run: %+v", res)
	}
	r := lastRun(t, pool)
	if r.Mode != runhistory.ModeSchedule || r.Result != runhistory.ResultComplete {
		t.Fatalf("the scheduled run is recorded as %+v", r)
	}
	if last, err := runhistory.LastSuccess(ctx, pool); err != nil || last == nil || !last.Equal(*r.FinishedAt) {
		t.Fatalf("LastSuccess = %v, %v; want the scheduled run's end %v", last, err, r.FinishedAt)
	}
	if err := svc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := gatherValues(t, reg)["idemd_reaper_history_last_success_timestamp_seconds"]; ok {
		t.Error("the reaper exports the history's last success; internal/dbstats owns that gauge")
	}
}

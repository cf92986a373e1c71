package reaper

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// dueOnce is a schedule whose first time is now and every later one an
// hour after it asks: one run at once, then none within a test.
type dueOnce struct{ asked atomic.Bool }

func (d *dueOnce) Next(t time.Time) time.Time {
	if !d.asked.Swap(true) {
		return t
	}
	return t.Add(time.Hour)
}

// TestScheduleMode: on --schedule a run happens at the schedule's times,
// reaps, and marks readiness, whose limit comes from the schedule.
func TestScheduleMode(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 10)
	svc := newService(t, pool, func(s *Settings) { s.Schedule = "@every 1s" })
	ready := &opshttp.Readiness{}
	svc.Ready = ready
	svc.signals.passed.Init(t)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if want := 2*time.Second + svc.cfg.MaxRuntime; ready.MaxPassAge() != want {
		t.Errorf("readiness allows a run %s old, want two intervals and --max-runtime, %s", ready.MaxPassAge(), want)
	}
	res := svc.signals.passed.WaitOrTimeout(t)
	if res.Deleted != 10 || !res.Complete {
		t.Fatalf("first scheduled run: %+v", res)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys left", n)
	}
	testwait.Until(t, time.Minute, "readiness to be marked", func() bool { return ready.Check(ctx, time.Now()) == nil })
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := svc.Stop(sctx); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleFailedRunWaitsForTheSchedule: a run that fails (here: over
// --max-deletes) is not retried in a loop; the next run is at the
// schedule's next time.
func TestScheduleFailedRunWaitsForTheSchedule(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertOldKeys(t, pool, 10)
	svc := newService(t, pool, func(s *Settings) { s.Schedule = "@hourly"; s.MaxDeletes = 1 })
	svc.schedule = &dueOnce{}
	svc.signals.passed.Init(t)
	svc.signals.next.Init(t)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if res := svc.signals.passed.WaitOrTimeout(t); res.StopReason != "error" || res.Deleted != 0 {
		t.Fatalf("the run over the cap: %+v", res)
	}
	if d := svc.signals.next.WaitOrTimeout(t); d < 59*time.Minute {
		t.Fatalf("after a failed run the next is due in %s, want the schedule's hour", d)
	}
	if err := svc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStopWaitsForTheRun: Stop, or the end of Start's context, asks the
// run in progress to stop, and Stop returns only once it has: its lease is
// released by then.
func TestStopWaitsForTheRun(t *testing.T) {
	for _, how := range []string{"Stop", "Start's context"} {
		t.Run(how, func(t *testing.T) {
			pool := dbtest.NewPool(t)
			insertOldKeys(t, pool, 10)
			svc := newService(t, pool, func(s *Settings) { s.Schedule = "@hourly" })
			svc.schedule = &dueOnce{}
			svc.signals.passed.Init(t)
			locked := make(chan struct{})
			svc.hooks.afterLock = func(ctx context.Context) {
				close(locked)
				<-ctx.Done() // the stop request
			}
			startCtx, cancelStart := context.WithCancel(context.Background())
			defer cancelStart()
			if err := svc.Start(startCtx); err != nil {
				t.Fatal(err)
			}
			<-locked
			if how == "Start's context" {
				cancelStart()
			}
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := svc.Stop(sctx); err != nil {
				t.Fatal(err)
			}
			if leaseHeld(t, pool) {
				t.Fatal("Stop returned while the run still held its lease")
			}
			res := svc.signals.passed.WaitOrTimeout(t)
			if res.StopReason != "shutdown" || res.Deleted != 0 || res.Complete {
				t.Fatalf("the stopped run: %+v", res)
			}
		})
	}
}

// TestStopDeadlineCutsTheBatch: a batch still running when Stop's deadline
// passes is cancelled and rolls back whole; Stop says so and returns once
// the run has ended.
func TestStopDeadlineCutsTheBatch(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertOldKeys(t, pool, 10)
	svc := newService(t, pool, func(s *Settings) { s.Schedule = "@hourly" })
	svc.schedule = &dueOnce{}
	svc.signals.passed.Init(t)
	inBatch := make(chan struct{})
	svc.hooks.inBatch = func(ctx context.Context, _ pgx.Tx) {
		close(inBatch)
		<-ctx.Done() // only Stop's deadline ends the batch's context
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-inBatch
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := svc.Stop(expired); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop after its deadline: %v, want the deadline's error", err)
	}
	res := svc.signals.passed.WaitOrTimeout(t)
	if res.StopReason != "shutdown" || res.Deleted != 0 || res.Batches != 0 {
		t.Fatalf("the cut run: %+v", res)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 10 {
		t.Fatalf("%d keys left, want all 10: the cut batch must roll back", n)
	}
	if leaseHeld(t, pool) {
		t.Fatal("the cut run did not release its lease")
	}
}

package reaper

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// pacingCluster is a private cluster for the WAL pacer's tests: its WAL is
// the run's alone (no other database's, no autovacuum's), so the server's
// WAL position measures what the pacer holds.
func pacingCluster(t *testing.T, settings ...string) (*pgxpool.Pool, *pgxpool.Pool) {
	t.Helper()
	c := dbtest.StartClusterWith(t, dbtest.ClusterOptions{Settings: append([]string{"autovacuum=off"}, settings...)})
	pool := privateDB(t, c)
	admin, err := pgxpool.New(context.Background(), c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return pool, admin
}

// insertManyOldKeys inserts n finished keys past retention, a millisecond
// apart: more than a paced run of a few seconds can delete.
func insertManyOldKeys(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO idempotency_keys (created_at, idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
SELECT now() - interval '100 hours' + g * interval '1 millisecond', 'many-' || g, NULL, 'POST', '{"amount": 100}', '/rides', 'finished', 7
FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		t.Fatal(err)
	}
}

// walMark is the server's WAL position and clock.
type walMark struct {
	lsn int64
	at  time.Time
}

func readWAL(t *testing.T, pool *pgxpool.Pool) walMark {
	t.Helper()
	var m walMark
	if err := pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8, clock_timestamp()`).Scan(&m.lsn, &m.at); err != nil {
		t.Fatal(err)
	}
	return m
}

func rate(a, b walMark) float64 { return float64(b.lsn-a.lsn) / b.at.Sub(a.at).Seconds() }

// sampleWAL reads the server's WAL position every 250 ms until stop is
// called, which returns the samples.
func sampleWAL(t *testing.T, pool *pgxpool.Pool) (stop func() []walMark) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var marks []walMark
	var failed error
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			var m walMark
			if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8, clock_timestamp()`).Scan(&m.lsn, &m.at); err != nil {
				if ctx.Err() == nil {
					failed = err
				}
				return
			}
			marks = append(marks, m)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() []walMark {
		cancel()
		wg.Wait()
		if failed != nil {
			t.Fatalf("sample the WAL position: %v", failed)
		}
		return marks
	}
}

// --max-load wal_rate=R holds: the WAL the server wrote over the run, by
// its own position and clock, is within 10 % of R, and so is every 10 s
// window of it; the run logs one line when its pacing starts and one when
// it ends, not one per batch. The run is bounded by --max-runtime (the
// table holds more than it can delete at R in that time), so its length
// does not depend on the machine's speed; R is small enough for any
// machine to reach.
func TestWALRateHolds(t *testing.T) {
	pool, admin := pacingCluster(t)
	insertManyOldKeys(t, pool, 300_000)
	const R = 512 << 10
	core, logs := observer.New(zap.InfoLevel)
	svc := newService(t, pool, func(s *Settings) {
		s.Throttle.MaxLoad = "wal_rate=512kB"
		s.MaxRuntime = 25 * time.Second
	})
	svc.logger = zap.New(core)
	stop := sampleWAL(t, admin)
	before := readWAL(t, admin)
	res, err := svc.RunOnce(context.Background())
	after := readWAL(t, admin)
	marks := stop()
	if err != nil || res.Complete || res.StopReason != stopMaxRuntime || res.Deleted == 0 {
		t.Fatalf("run: %+v, %v; want it stopped by --max-runtime with keys left", res, err)
	}
	got := rate(before, after)
	t.Logf("%d keys in %s, %d batches (last %d keys), %.0f B/s of WAL against %d, paced %s",
		res.Deleted, after.at.Sub(before.at), res.Batches, res.FinalBatchSize, got, R, res.Paced)
	if math.Abs(got-R) > 0.1*R {
		t.Errorf("the run wrote %.0f B/s, want within 10 %% of %d", got, R)
	}
	windows := 0
	for i := range marks {
		for j := i + 1; j < len(marks); j++ {
			if marks[j].at.Sub(marks[i].at) >= 10*time.Second {
				windows++
				if r := rate(marks[i], marks[j]); r > 1.1*R {
					t.Errorf("%.0f B/s over the 10 s from %s, over 1.1× %d", r, marks[i].at.Sub(before.at), R)
				}
				break
			}
		}
	}
	if windows < 10 {
		t.Errorf("only %d 10 s windows sampled", windows)
	}
	if res.Paced <= 0 || res.Throttled != 0 || res.WALRate != R {
		t.Errorf("paced %s, throttled %s, rate %.0f: want paced time only, at %d", res.Paced, res.Throttled, res.WALRate, R)
	}
	if n, m := logs.FilterMessage("reaper throttled: waiting before the next batch").Len(), logs.FilterMessage("reaper throttle lifted").Len(); n != 1 || m != 1 {
		t.Errorf("%d stretch starts and %d ends logged for %d batches, want one each", n, m, res.Batches)
	}
	if lifted := logs.FilterMessage("reaper throttle lifted").All(); len(lifted) == 1 {
		f := lifted[0].ContextMap()
		if f["rounds"].(int64) < int64(res.Batches)*9/10 || f["wal_bytes"].(int64) <= 0 {
			t.Errorf("the stretch's totals %v for %d batches", f, res.Batches)
		}
	}
}

// wal_rate=auto paces the run by the server's checkpoint budget, and a
// checkpoint the server requests during the run halves the rate and
// spends the bucket's credit: the WAL the run writes after it, by the server's
// position and clock, is within 10 % of the halved rate at most.
func TestRequestedCheckpointSlowsTheRun(t *testing.T) {
	// A small max_wal_size and the shortest checkpoint_timeout: a
	// checkpoint is requested after a segment (four segments / 1.9, less
	// one), 16 MB per 30s, a budget of 0.45 MB/s: the 20 s run cannot
	// fill it after the CHECKPOINT before it.
	pool, admin := pacingCluster(t, "max_wal_size=64MB", "checkpoint_timeout=30s", "checkpoint_completion_target=0.9")
	insertManyOldKeys(t, pool, 300_000)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	budget := throttle.Checkpoints{MaxWALSize: 64 << 20, Timeout: 30 * time.Second, CompletionTarget: 0.9, SegmentSize: 16 << 20}.WALBudget().Rate
	var once sync.Once
	var at walMark
	svc := newService(t, pool, func(s *Settings) {
		s.Throttle.MaxLoad = "wal_rate=auto"
		s.MaxRuntime = 20 * time.Second
	})
	svc.hooks.afterRound = func(ctx context.Context, batches int) {
		if batches < 5 {
			return
		}
		once.Do(func() {
			if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
				t.Errorf("checkpoint: %v", err)
			}
			at = readWAL(t, admin)
		})
	}
	res, err := svc.RunOnce(ctx)
	after := readWAL(t, admin)
	if err != nil || res.StopReason != stopMaxRuntime {
		t.Fatalf("run: %+v, %v; want it stopped by --max-runtime", res, err)
	}
	n := res.RequestedCheckpoints
	if n < 1 {
		t.Fatalf("no requested checkpoint seen: %+v", res)
	}
	want := budget / math.Pow(2, float64(min(n, 3)))
	if res.WALRate != want {
		t.Errorf("rate at the end %.0f after %d requested checkpoints, want %.0f (budget %.0f halved for each)", res.WALRate, n, want, budget)
	}
	got := rate(at, after)
	t.Logf("budget %.0f B/s; after the CHECKPOINT %.0f B/s over %s; %d requested", budget, got, after.at.Sub(at.at), n)
	if after.at.Sub(at.at) < 10*time.Second {
		t.Fatalf("only %s after the checkpoint: the run is too short to measure", after.at.Sub(at.at))
	}
	if got > 1.1*budget/2 {
		t.Errorf("after the checkpoint the run wrote %.0f B/s, over 1.1× half the budget %.0f", got, budget/2)
	}
}

// The defaults measure their limits on the server (the WAL rate from the
// checkpoint settings before the first batch, the commit budget from the
// probe after it) and start at the smallest batch; a run with one batch
// to do does not probe.
func TestDefaultLoadLimitsAreMeasured(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertOldKeys(t, pool, 3000)
	svc := newService(t, pool, func(s *Settings) { s.Throttle.MaxLoad = DefaultThrottle().MaxLoad })
	res, err := svc.RunOnce(context.Background())
	if err != nil || !res.Complete || res.Deleted != 3000 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if res.CommitBudget < 4*time.Millisecond || res.WALRate <= 0 {
		t.Fatalf("budget %s, WAL rate %.0f: want both measured", res.CommitBudget, res.WALRate)
	}
	// 3000 keys from a first batch of 500 growing by a twentieth of the
	// range: more than one batch.
	if res.Batches < 2 {
		t.Fatalf("%d batches: want the first at %d keys", res.Batches, throttle.MinBatch)
	}
	insertOldKeys(t, pool, 100)
	res, err = svc.RunOnce(context.Background())
	if err != nil || !res.Complete || res.Deleted != 100 || res.CommitBudget != 0 {
		t.Fatalf("a run of one batch: %+v, %v; want no budget measured", res, err)
	}
}

// wal_rate=auto reads the server's checkpoint cycle as the runtime role:
// a CHECKPOINT shows in the count of checkpoints begun and in the control
// file's redo; and a run that spans a timed checkpoint keeps the server
// from requesting one (the server's own count) while it writes at the
// budget's rate, not held by a guard that misread the cycle (at its floor
// it would write an eighth of it).
func TestAutoRateFollowsTheCheckpointCycle(t *testing.T) {
	// A checkpoint requested after 16 MB since the last redo, one due
	// every 30 s: a budget of 0.42 MB/s.
	pool, admin := pacingCluster(t, "max_wal_size=64MB", "checkpoint_timeout=30s", "checkpoint_completion_target=0.9")
	ctx := context.Background()
	// The keys first: their WAL makes the server request checkpoints.
	insertManyOldKeys(t, pool, 300_000)
	r := &throttle.Reader{Primary: pool}
	c, err := r.ReadCheckpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := r.Read(ctx)
	if first.Err != nil || first.ControlRedo <= 0 || first.ControlRedo > first.WALPosition || first.ControlAge < 0 {
		t.Fatalf("first reading: %+v", first)
	}
	if _, err := admin.Exec(ctx, "CREATE TABLE marker AS SELECT 1 AS x"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	// The checkpointer reports its count just after the checkpoint ends.
	deadline := time.Now().Add(30 * time.Second)
	s := r.Read(ctx)
	for s.Err == nil && s.CheckpointsBegun == first.CheckpointsBegun && time.Now().Before(deadline) {
		s = r.Read(ctx)
	}
	if s.Err != nil || s.CheckpointsBegun != first.CheckpointsBegun+1 || s.RequestedCheckpoints != first.RequestedCheckpoints+1 ||
		s.ControlRedo <= first.ControlRedo || s.ControlAge > 10*time.Second {
		t.Fatalf("after a CHECKPOINT: %+v (before %+v)", s, first)
	}

	var timed0, req0 int64
	if err := admin.QueryRow(ctx, `SELECT checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter`).Scan(&timed0, &req0); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, func(s *Settings) {
		s.Throttle.MaxLoad = "wal_rate=auto"
		s.MaxRuntime = 40 * time.Second
	})
	before := readWAL(t, admin)
	res, err := svc.RunOnce(ctx)
	after := readWAL(t, admin)
	if err != nil || res.StopReason != stopMaxRuntime || res.Deleted == 0 {
		t.Fatalf("run: %+v, %v; want it stopped by --max-runtime with keys left", res, err)
	}
	// The timed checkpoint due 30 s after the CHECKPOINT began during the
	// run; its count may be reported only when it completes (27 s later),
	// and the control file has its start then.
	var timed, req int64
	var began time.Time
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); ; {
		if err := admin.QueryRow(ctx, `SELECT checkpoints_timed, checkpoints_req, checkpoint_time FROM pg_stat_bgwriter, pg_control_checkpoint()`).Scan(&timed, &req, &began); err != nil {
			t.Fatal(err)
		}
		if (timed > timed0 && began.After(before.at)) || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	budget := c.WALBudget().Rate
	got := rate(before, after)
	t.Logf("%d keys, %.0f B/s against a budget of %.0f; timed checkpoints %d, requested %d", res.Deleted, got, budget, timed-timed0, req-req0)
	if req != req0 || res.RequestedCheckpoints != 0 {
		t.Errorf("the server requested %d checkpoints during the run (the run saw %d)", req-req0, res.RequestedCheckpoints)
	}
	if timed == timed0 || !began.After(before.at) || !began.Before(after.at) {
		t.Errorf("no timed checkpoint began during the run (%s to %s; the last began %s): it did not span a cycle", before.at, after.at, began)
	}
	if got < budget/2 {
		t.Errorf("the run wrote %.0f B/s, under half the budget %.0f: the guard held it", got, budget)
	}
}

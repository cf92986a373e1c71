package enqueuer

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lifecycle/testsignal"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// newService builds a Service on pool with DefaultSettings, changed by
// each of change.
func newService(t *testing.T, pool *pgxpool.Pool, change ...func(*Settings)) *Service {
	t.Helper()
	cfg := Config{Settings: DefaultSettings(), Pool: pool}
	for _, c := range change {
		c(&cfg.Settings)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stagedIDsInRiver is the oracle: the staged ids River holds, read from the
// job metadata with SQL, independent of the enqueuer's own counters.
func stagedIDsInRiver(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT (metadata->>'idemd_staged_id')::bigint FROM river_job ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestDrainMovesRowsWithOptions(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{"ride_id": 1}');
INSERT INTO staged_jobs (job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata)
VALUES ('send_ride_receipt', '{"ride_id": 2}', 'mail', 2, 5, now() + interval '1 hour', '{ride,receipt}', '{"trace": "abc"}');`)
	if err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool)
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 2 || res.DeadLettered != 0 {
		t.Fatalf("drain result %+v", res)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs"); n != 0 {
		t.Fatalf("%d rows left staged", n)
	}
	type job struct {
		Kind, Queue, State string
		Priority, Max      int16
		Args, Meta         []byte
		Tags               []string
		Future             bool
	}
	rows, _ := pool.Query(ctx, `SELECT kind, queue, state::text, priority, max_attempts, args, metadata, tags, scheduled_at > now()
FROM river_job ORDER BY (metadata->>'idemd_staged_id')::bigint`)
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		err := r.Scan(&j.Kind, &j.Queue, &j.State, &j.Priority, &j.Max, &j.Args, &j.Meta, &j.Tags, &j.Future)
		return j, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("got %d jobs", len(jobs))
	}
	if j := jobs[0]; j.Kind != "send_ride_receipt" || j.Queue != "default" || j.State != "available" || j.Priority != 1 || j.Max != 25 || string(j.Args) != `{"ride_id": 1}` {
		t.Fatalf("plain job: %+v", j)
	}
	if j := jobs[1]; j.Queue != "mail" || j.Priority != 2 || j.Max != 5 || j.State != "scheduled" || !j.Future || !slices.Equal(j.Tags, []string{"ride", "receipt"}) {
		t.Fatalf("job with options: %+v", j)
	}
	var meta map[string]any
	if err := json.Unmarshal(jobs[1].Meta, &meta); err != nil {
		t.Fatal(err)
	}
	if meta["trace"] != "abc" || meta["idemd_staged_id"] == nil || meta["idemd_staged_at"] == nil {
		t.Fatalf("metadata not merged: %v", meta)
	}
	if _, err := time.Parse(time.RFC3339Nano, meta["idemd_staged_at"].(string)); err != nil {
		t.Fatalf("staged_at: %v", err)
	}
}

func TestPoisonRowsAreDeadLetteredAndNeverBlockTheBatch(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	big := `{"blob": "` + strings.Repeat("x", 2000) + `"}`
	_, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args) VALUES ('good', '{"n": 1}');
INSERT INTO staged_jobs (job_name, job_args) VALUES ('unlisted', '{"n": 2}');
INSERT INTO staged_jobs (job_name, job_args, queue) VALUES ('good', '{"n": 3}', 'Bad Queue!');
INSERT INTO staged_jobs (job_name, job_args, priority) VALUES ('good', '{"n": 4}', 9);
INSERT INTO staged_jobs (job_name, job_args, max_attempts) VALUES ('good', '{"n": 5}', 0);
INSERT INTO staged_jobs (job_name, job_args) VALUES ('good', '{"big": "placeholder"}');
INSERT INTO staged_jobs (job_name, job_args) VALUES ('good', '[1, 2]');
INSERT INTO staged_jobs (job_name, job_args, tags) VALUES ('good', '{"n": 8}', '{"no spaces allowed"}');
INSERT INTO staged_jobs (job_name, job_args, metadata) VALUES ('good', '{"n": 9}', '[1]');
INSERT INTO staged_jobs (job_name, job_args) VALUES ('good', '{"n": 10}');
INSERT INTO staged_jobs (job_name, job_args) VALUES ('', '{"n": 11}');
INSERT INTO staged_jobs (job_name, job_args, tags) VALUES ('good', '{"n": 12}', '{ride,NULL}');
`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE staged_jobs SET job_args = $1 WHERE job_args ? 'big'`, big); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool, func(s *Settings) { s.AllowedKinds, s.MaxArgsBytes = []string{"good"}, 1024 })
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 2 || res.DeadLettered != 10 {
		t.Fatalf("drain result %+v", res)
	}
	var moved []int
	rows, _ := pool.Query(ctx, `SELECT (args->>'n')::int FROM river_job ORDER BY 1`)
	moved, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, []int{1, 10}) {
		t.Fatalf("moved %v, want [1 10]", moved)
	}
	wantReasons := map[string]string{
		"unlisted":  riverdb.ReasonUnknownKind,
		`{"n": 3}`:  riverdb.ReasonInvalidQueue,
		`{"n": 4}`:  riverdb.ReasonInvalidPrio,
		`{"n": 5}`:  riverdb.ReasonInvalidMaxAtt,
		"big":       riverdb.ReasonArgsTooLarge,
		"[1, 2]":    riverdb.ReasonInvalidArgs,
		`{"n": 8}`:  riverdb.ReasonInvalidTags,
		`{"n": 9}`:  riverdb.ReasonInvalidMeta,
		`{"n": 11}`: riverdb.ReasonInvalidKind,
		`{"n": 12}`: riverdb.ReasonInvalidTags,
	}
	rows, _ = pool.Query(ctx, `SELECT CASE WHEN job_name = 'unlisted' THEN 'unlisted' WHEN length(job_args::text) > 1000 THEN 'big' ELSE job_args::text END, reason FROM staged_jobs_dead`)
	got := map[string]string{}
	for rows.Next() {
		var k, reason string
		if err := rows.Scan(&k, &reason); err != nil {
			t.Fatal(err)
		}
		got[k] = reason
	}
	if len(got) != len(wantReasons) {
		t.Fatalf("dead rows %v", got)
	}
	for k, code := range wantReasons {
		if !strings.HasPrefix(got[k], code+": ") {
			t.Errorf("row %s: reason %q, want prefix %q", k, got[k], code)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs"); n != 0 {
		t.Fatalf("%d rows left staged", n)
	}
	if v := testutil.ToFloat64(s.metrics.deadLettered.WithLabelValues(riverdb.ReasonInvalidQueue)); v != 1 {
		t.Fatalf("dead-letter metric for invalid_queue = %v", v)
	}
}

// TestRowsRiverRejectsAreDeadLetteredAlone: a row that passes the
// enqueuer's validation but that the database refuses as a River job (here
// a CHECK constraint an operator added to river_job) fails its batch's
// COPY; the batch is redone row by row, the refused rows are dead-lettered
// with the database's reason and every other row becomes a job.
func TestRowsRiverRejectsAreDeadLetteredAlone(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	// As river_job's owner, the migrator: the enqueuer's role may not alter it.
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `ALTER TABLE river_job ADD CONSTRAINT no_poison CHECK (NOT args ? 'poison')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args)
SELECT 'good', CASE WHEN g % 10 = 0 THEN jsonb_build_object('n', g, 'poison', true) ELSE jsonb_build_object('n', g) END
FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool, func(s *Settings) { s.BatchSize = 20 })
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 45 || res.DeadLettered != 5 {
		t.Fatalf("drain result %+v", res)
	}
	if n := count(t, pool, "SELECT count(*) FROM river_job WHERE (args->>'n')::int % 10 <> 0"); n != 45 {
		t.Fatalf("%d good rows in River, want 45", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead
WHERE job_args ? 'poison' AND reason LIKE $1 AND reason LIKE '%no_poison%'`, riverdb.ReasonRejectedByRiver+": %"); n != 5 {
		t.Fatalf("%d poison rows dead-lettered with the constraint as reason, want 5", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs"); n != 0 {
		t.Fatalf("%d rows left staged", n)
	}
}

// A transaction holding a low id open across several drains: rows with
// higher ids move past it, and it moves once it commits. A high-water-mark
// design would lose it.
func TestLateCommittingLowerIDIsMoved(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.BatchSize = 10 })

	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx) //nolint:errcheck
	var lateID int64
	if err := late.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('late', '{}') RETURNING id`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'early', '{}' FROM generate_series(1, 25)`); err != nil {
			t.Fatal(err)
		}
		res, err := s.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Moved != 25 {
			t.Fatalf("pass %d moved %d, want 25", pass, res.Moved)
		}
	}
	if ids := stagedIDsInRiver(t, pool); slices.Contains(ids, lateID) || len(ids) != 75 || ids[0] <= lateID {
		t.Fatalf("before commit: %d jobs, lowest %d, late id %d", len(ids), ids[0], lateID)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 1 || !slices.Contains(stagedIDsInRiver(t, pool), lateID) {
		t.Fatalf("late row not moved: %+v", res)
	}
}

// The invariant under concurrency: writers staging (some rolling back) while
// three started services drain. River ends with exactly one job per
// committed staged id and none for rolled-back ones.
func TestExactlyOnceWithConcurrentWritersAndReplicas(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const (
		writers     = 4
		txPerWriter = 50
		rowsPerTx   = 500 // 4*50*500 = 100k rows attempted
	)

	var services []*Service
	for range 3 {
		// A long poll interval: the services must be woken by NOTIFY.
		s := newService(t, pool, func(s *Settings) { s.BatchSize, s.SweepInterval = 1000, time.Hour })
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		services = append(services, s)
	}

	var (
		mu         sync.Mutex
		committed  []int64
		rolledBack []int64
	)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for range txPerWriter {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				rows, err := tx.Query(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'work', jsonb_build_object('i', g) FROM generate_series(1, $1) g RETURNING id`, rowsPerTx)
				if err != nil {
					t.Error(err)
					return
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					t.Error(err)
					return
				}
				if rng.IntN(10) == 0 {
					_ = tx.Rollback(ctx)
					mu.Lock()
					rolledBack = append(rolledBack, ids...)
					mu.Unlock()
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				committed = append(committed, ids...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	testwait.Until(t, 2*time.Minute, "staged_jobs to drain", func() bool {
		return count(t, pool, "SELECT count(*) FROM staged_jobs") == 0
	})
	for _, s := range services {
		if err := s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(committed) < 80_000 || len(rolledBack) == 0 {
		t.Fatalf("test did not exercise enough: %d committed, %d rolled back", len(committed), len(rolledBack))
	}
	got := stagedIDsInRiver(t, pool)
	slices.Sort(committed)
	if !slices.Equal(got, committed) {
		t.Fatalf("River holds %d jobs for %d committed rows (duplicates or losses)", len(got), len(committed))
	}
	if n := count(t, pool, "SELECT count(*) FROM river_job WHERE (metadata->>'idemd_staged_id')::bigint = ANY($1)", rolledBack); n != 0 {
		t.Fatalf("%d jobs for rolled-back rows", n)
	}
	var woken float64
	for _, s := range services {
		woken += testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("notify"))
	}
	if woken == 0 {
		t.Fatal("no service was woken by NOTIFY")
	}
}

func TestWakesOnNotifyWithoutPolling(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval = time.Hour })
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	// The first row may be moved by the drain the listener's connect
	// triggers; its notification must arrive all the same.
	testwait.Until(t, 2*time.Minute, "first row to move", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 1 })
	testwait.Until(t, 2*time.Minute, "its notification", func() bool { return testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("notify")) >= 1 })
	// From here on, with an hour-long poll and the listener connected, only
	// a notification can wake the service: the second row proves it.
	reconnects := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("reconnect"))
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "second row to move", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 2 })
	if testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("poll")) != 0 {
		t.Fatal("a poll happened with an hour-long interval")
	}
	if testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("reconnect")) != reconnects {
		t.Fatal("the listener reconnected during the test; the second row's wake-up is not attributable")
	}
}

// Connections cut under the service: its listener and batch connections are
// terminated by the server repeatedly while rows are staged. It reconnects
// by itself and every committed row still becomes exactly one job.
func TestSurvivesTerminatedConnections(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = "idemd-enqueuer-under-test"
	svcPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svcPool.Close()
	s := newService(t, svcPool, func(s *Settings) { s.BatchSize, s.SweepInterval = 200, 50*time.Millisecond })
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The listener's first connection counts as a reconnect wake-up too; the
	// first cut below must find it up, so a second one proves it came back.
	s.signals.listenerUp.WaitOrTimeout(t)
	var staged atomic.Int64
	for round := range 20 {
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' FROM generate_series(1, 1000)`); err != nil {
			t.Fatal(err)
		}
		staged.Add(1000)
		// Cut every connection the service has, mid-drain or mid-wait.
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'idemd-enqueuer-under-test'`); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	testwait.Until(t, 2*time.Minute, "drain after connection cuts", func() bool {
		return count(t, pool, "SELECT count(*) FROM staged_jobs") == 0
	})
	// Polling can finish the drain before the listener's backoff has run
	// out: wait for it to be back rather than catch it in between.
	testwait.Until(t, time.Minute, "listener reconnected after the cuts", func() bool {
		return testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("reconnect")) >= 2 && testutil.ToFloat64(s.metrics.listenerUp) == 1
	})
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	ids := stagedIDsInRiver(t, pool)
	if int64(len(ids)) != staged.Load() || len(slices.Compact(ids)) != len(ids) {
		t.Fatalf("%d jobs (%d distinct) for %d staged rows", len(ids), len(slices.Compact(slices.Clone(ids))), staged.Load())
	}
}

type workArgs struct {
	N int `json:"n"`
}

func (workArgs) Kind() string { return "idemd_test_work" }

type worker struct {
	river.WorkerDefaults[workArgs]
	seen chan int
}

func (w *worker) Work(_ context.Context, j *river.Job[workArgs]) error {
	w.seen <- j.Args.N
	return nil
}

// A real River client with a worker registered works what the enqueuer moved.
func TestRiverWorkerWorksMovedJobs(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const n = 200
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'idemd_test_work', jsonb_build_object('n', g) FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	w := &worker{seen: make(chan int, n)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers:           workers,
		FetchPollInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rc.Stop(ctx) //nolint:errcheck

	s := newService(t, pool, func(s *Settings) { s.BatchSize = 64 })
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[int]bool{}
	deadline := time.After(2 * time.Minute)
	for len(got) < n {
		select {
		case v := <-w.seen:
			if got[v] {
				t.Fatalf("job %d worked twice", v)
			}
			got[v] = true
		case <-deadline:
			t.Fatalf("worked %d of %d", len(got), n)
		}
	}
	testwait.Until(t, 2*time.Minute, "jobs completed", func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE state = 'completed'") == n
	})
}

// Stop lets the batch in flight when it is called commit: the batch is
// held on the server (a lock on river_job blocks its insert) until the
// stop has been requested, and after Stop returns its rows are in River.
// A Stop that cancelled the batch would leave River empty: no batch could
// commit before it.
func TestStopFinishesTheCurrentBatch(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const total, batch = 20000, 500
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' FROM generate_series(1, $1)`, total); err != nil {
		t.Fatal(err)
	}
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx) //nolint:errcheck
	// Reads of river_job go on; the move's insert waits.
	if _, err := hold.Exec(ctx, `LOCK TABLE river_job IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool, func(s *Settings) { s.BatchSize, s.SweepInterval = batch, time.Hour })
	stops := make(chan lifecycle.Stop, 1)
	s.hooks.drainStop = func(st lifecycle.Stop) {
		select {
		case stops <- st:
		default:
		}
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var stop lifecycle.Stop
	select {
	case stop = <-stops:
	case <-time.After(testsignal.Timeout):
		t.Fatal("no drain started")
	}
	testwait.Until(t, 2*time.Minute, "the batch waits for river_job's lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'river_job'::regclass`) > 0
	})

	stopCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(stopCtx) }()
	select {
	case <-stop.Done():
	case <-time.After(testsignal.Timeout):
		t.Fatal("Stop did not request the stop")
	}
	// The stop is requested while the batch is in flight; let it go on.
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}

	inRiver := count(t, pool, "SELECT count(*) FROM river_job")
	left := count(t, pool, "SELECT count(*) FROM staged_jobs")
	if inRiver < batch {
		t.Fatalf("after Stop, %d jobs in River: the batch in flight when Stop was called did not commit", inRiver)
	}
	// Whatever moved, moved whole: a whole number of batches, nothing lost.
	if inRiver+left != total || inRiver%batch != 0 || inRiver != int64(testutil.ToFloat64(s.metrics.moved)) {
		t.Fatalf("after Stop: %d in River, %d staged, %v counted", inRiver, left, testutil.ToFloat64(s.metrics.moved))
	}
	// Started again, it finishes the job.
	s.hooks.drainStop = nil
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "drain after restart", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == total })
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// New refuses what Settings.Check refuses, with the flags' words, and
// zero is a value like any other: a zero batch size is refused, not taken
// for the default.
func TestNewChecksTheSettings(t *testing.T) {
	for _, c := range []struct {
		change func(*Settings)
		want   string
	}{
		{func(s *Settings) { s.BatchSize = -1 }, "--batch-size must be between 1 and 100000, got -1"},
		{func(s *Settings) { s.BatchSize = 0 }, "--batch-size must be between 1 and 100000, got 0"},
		{func(s *Settings) { s.BatchSize = 1_000_000 }, "--batch-size must be between 1 and 100000, got 1000000"},
		{func(s *Settings) { s.Workers = 0 }, "--workers must be between 1 and 64, got 0"},
		{func(s *Settings) { s.SweepInterval = -time.Second }, "--sweep-interval must be positive"},
		{func(s *Settings) { s.SweepInterval = 0 }, "--sweep-interval must be positive"},
		{func(s *Settings) { s.MaxArgsBytes = 0 }, "--max-args-bytes must be positive"},
		{func(s *Settings) { s.StatsInterval = 0 }, "--stats-interval must be positive"},
		{func(s *Settings) { s.ListenerCheckInterval = 0 }, "--listener-check-interval must be positive"},
		{func(s *Settings) { s.ListenerCheckTimeout = 0 }, "--listener-check-timeout must be positive"},
		{func(s *Settings) { s.AllowedKinds = []string{""} }, `--allowed-kinds: kind "" must be 1 to 127 bytes`},
		{func(s *Settings) { s.AllowedKinds = []string{" "} }, `--allowed-kinds: kind " " must be 1 to 127 bytes`},
		{func(s *Settings) { s.ListenDatabaseURL = "postgres://u:SECRET@h:notaport/d" }, "--listen-database-url: cannot parse the connection URL"},
		{func(s *Settings) { s.ListenDatabaseURL, s.PollOnly = "postgres://u@h/d", true }, "--listen-database-url and --poll-only contradict each other"},
	} {
		cfg := Config{Settings: DefaultSettings(), Pool: &pgxpool.Pool{}}
		c.change(&cfg.Settings)
		_, err := New(cfg)
		var ce *config.Error
		if !errors.As(err, &ce) || !slices.Contains(ce.Problems, c.want) {
			t.Errorf("want problem %q, got %v", c.want, err)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("the listen URL's password was printed: %v", err)
		}
	}
	if s := DefaultSettings(); len(s.Check()) != 0 {
		t.Errorf("DefaultSettings has problems: %q", s.Check())
	}
	_, err := New(Config{Settings: DefaultSettings()})
	var ce *config.Error
	if !errors.As(err, &ce) || !slices.Contains(ce.Problems, "a database pool is required") {
		t.Errorf("no pool: %v", err)
	}
}

// A staged metadata integer above 2^53 reaches River's job exactly (jsonb
// keeps numeric precision; the enqueuer must not round it on the way).
func TestMetadataNumbersReachRiverExactly(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, metadata)
VALUES ('k', '{}', '{"snowflake": 9007199254740993, "trace": {"span_id": 18446744073709551615}}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := newService(t, pool).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var snowflake, span string
	if err := pool.QueryRow(ctx, `SELECT metadata->>'snowflake', metadata#>>'{trace,span_id}' FROM river_job`).Scan(&snowflake, &span); err != nil {
		t.Fatal(err)
	}
	if snowflake != "9007199254740993" || span != "18446744073709551615" {
		t.Fatalf("River's metadata holds %s and %s", snowflake, span)
	}
}

// riverNewest is the River schema version the tests' databases are at:
// River's newest, as `idemctl migrate` leaves them.
var riverNewest = migrate.RiverSchemaVersions[len(migrate.RiverSchemaVersions)-1]

package enqueuer

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
	"github.com/idemd/idemd/migrations"
)

// nextPollAction, without a database: when a drainer starts and stops
// polling.
func TestNextPollAction(t *testing.T) {
	const iv = 5 * time.Millisecond
	cases := []struct {
		name                string
		polling, canPoll    bool
		interval            time.Duration
		notifyRate, rowRate float64
		want                pollAction
	}{
		{"notified, everyday rate", false, true, iv, pollStartRate - 1, 0, pollStay},
		{"notified, a stream", false, true, iv, pollStartRate, 0, pollStart},
		{"a stream, polling off", false, true, 0, 10 * pollStartRate, 0, pollStay},
		{"a stream, no listener or gate", false, false, iv, 10 * pollStartRate, 0, pollStay},
		{"polling, rows keep coming", true, true, iv, 0, pollStopRate, pollStay},
		{"polling, between the thresholds", true, true, iv, 0, (pollStartRate + pollStopRate) / 2, pollStay},
		{"polling, the stream ebbed", true, true, iv, 0, pollStopRate - 1, pollStop},
		{"polling, the listener went", true, false, iv, 0, 10 * pollStartRate, pollStop},
		{"polling, turned off", true, true, 0, 0, 10 * pollStartRate, pollStop},
	}
	for _, c := range cases {
		if got := nextPollAction(c.polling, c.canPoll, c.interval, c.notifyRate, c.rowRate); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// nextPollWait, without a database: a poll that took rows is followed
// after --busy-poll-interval; empty ones back off to maxPollBackoff.
func TestNextPollWait(t *testing.T) {
	const iv = 5 * time.Millisecond
	w := nextPollWait(0, iv, 0)
	if w != iv {
		t.Fatalf("first wait %s", w)
	}
	var seen []time.Duration
	for range 6 {
		w = nextPollWait(w, iv, 0)
		seen = append(seen, w)
	}
	if want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, maxPollBackoff, maxPollBackoff, maxPollBackoff}; !slices.Equal(seen, want) {
		t.Fatalf("empty polls wait %v, want %v", seen, want)
	}
	if w = nextPollWait(w, iv, 3); w != iv {
		t.Fatalf("after a poll that took rows: %s", w)
	}
	if w = nextPollWait(maxPollBackoff, 200*time.Millisecond, 0); w != 200*time.Millisecond {
		t.Fatalf("an interval above the backoff's ceiling: %s", w)
	}
}

// listening is a session of its own LISTENing on the staged_jobs channel,
// closed when the test ends: the tests' independent witness of what the
// trigger sends.
func listening(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) }) //nolint:errcheck
	if _, err := conn.Exec(context.Background(), listenSQL); err != nil {
		t.Fatal(err)
	}
	return conn
}

// heardUntil reads notifications on the staged_jobs channel from conn until
// the sentinel payload arrives (NOTIFYs are delivered in commit order, so
// everything committed before the sentinel was sent has been heard by then)
// and returns the staged_jobs payloads before it.
func heardUntil(t *testing.T, conn *pgx.Conn, pool *pgxpool.Pool, sentinel string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, sentinel); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v", sentinel, err)
		}
		if n.Payload == sentinel {
			return got
		}
		got = append(got, n.Payload)
	}
}

// pollLocks returns P's and H's keys for the test database's staged_jobs.
func pollLocks(t *testing.T, pool *pgxpool.Pool) (p, h int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), pollKeysSQL, pollingLockClass, handoffLockClass).Scan(&p, &h); err != nil {
		t.Fatal(err)
	}
	return p, h
}

// The trigger's protocol (migration 00018), seen from outside: with no one
// holding P every commit notifies with the lowest id it staged; while P is
// held commits skip their notification and hold H until they end; while H
// is taken (a handoff) they notify again. The independent oracle is a
// LISTENing session.
func TestTriggerNotifiesUnlessPolled(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	listener := listening(t, pool)
	stage := func(ids ...int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args) SELECT i, 'k', '{}' FROM unnest($1::bigint[]) WITH ORDINALITY u(i, o) ORDER BY o`, ids); err != nil {
			t.Fatal(err)
		}
	}

	// Nobody polls: one notification per transaction, its lowest id; a
	// later row with a lower id notifies again.
	stage(100, 101, 102)
	stage(300, 200)
	if got, want := heardUntil(t, listener, pool, "s1"), []string{"100", "300", "200"}; !slices.Equal(got, want) {
		t.Fatalf("heard %q, want %q", got, want)
	}

	p, h := pollLocks(t, pool)
	drainer, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer drainer.Close(ctx)
	if _, err := drainer.Exec(ctx, "SELECT pg_advisory_lock($1)", p); err != nil {
		t.Fatal(err)
	}

	// Polled: no notification.
	stage(400)
	if got := heardUntil(t, listener, pool, "s2"); len(got) != 0 {
		t.Fatalf("a polled commit notified: %q", got)
	}

	// A transaction that skipped its notification holds H until it ends
	// (the trigger fires early here, at SET CONSTRAINTS, as it would for
	// an API that sets its constraints immediate).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args) VALUES (500, 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	tryH := func() bool {
		var got bool
		if err := drainer.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", h).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if tryH() {
		t.Fatal("H was free while a transaction that skipped its notification was open")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !tryH() {
		t.Fatal("H still taken after that transaction committed")
	}
	if got := heardUntil(t, listener, pool, "s3"); len(got) != 0 {
		t.Fatalf("a polled commit notified: %q", got)
	}

	// A handoff in progress (H taken exclusively): commits notify.
	htx, err := drainer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", h); err != nil {
		t.Fatal(err)
	}
	stage(600)
	if err := htx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := heardUntil(t, listener, pool, "s4"), []string{"600"}; !slices.Equal(got, want) {
		t.Fatalf("during a handoff heard %q, want %q", got, want)
	}

	// The drainer's session ends (it died): commits notify at once. The
	// client's Close only sends Terminate: the server releases the
	// session's lock P when its backend exits, a moment later.
	var drainerPID int
	if err := drainer.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&drainerPID); err != nil {
		t.Fatal(err)
	}
	if err := drainer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Minute, "the drainer's backend to exit", func() bool {
		var alive bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", drainerPID).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		return !alive
	})
	stage(700)
	if got, want := heardUntil(t, listener, pool, "s5"), []string{"700"}; !slices.Equal(got, want) {
		t.Fatalf("after the drainer's session ended heard %q, want %q", got, want)
	}
}

// The gate's handoff waits for the transactions that skipped their
// notification: while one is open it times out and keeps P (commits still
// skip their notification), and once that transaction has committed it
// succeeds and releases P (commits notify again).
func TestHandoffWaitsForSkippedCommits(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	listener := listening(t, pool)
	var g gate
	if err := g.open(ctx, pool.Config().ConnConfig, nil, nil); err != nil {
		t.Fatal(err)
	}
	defer g.close(ctx)
	gen, err := g.take(ctx)
	if err != nil || gen == 0 {
		t.Fatalf("take P: generation %d, %v", gen, err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.release(ctx, pool, gen); err != nil || ok {
		t.Fatalf("handoff with a skipped commit open: %v, %v; want a timeout", ok, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if got := heardUntil(t, listener, pool, "s1"); len(got) != 0 {
		t.Fatalf("P was given up by a handoff that timed out: %q", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.release(ctx, pool, gen); err != nil || !ok {
		t.Fatalf("handoff once the skipped commit ended: %v, %v", ok, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args) VALUES (1000, 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if got, want := heardUntil(t, listener, pool, "s2"), []string{"1000"}; !slices.Equal(got, want) {
		t.Fatalf("after the handoff heard %q, want %q", got, want)
	}
}

// Streams of commits make the drainer poll, and each stream's end hands it
// back to notifications; the sweep wakes nothing here (it only moves the
// low-water mark), so a row that a handoff lost would stay staged and fail
// the test. Every committed row becomes exactly one River job (the oracle:
// SQL on river_job), and no gap is counted.
func TestPollingUnderStreamsLosesNothing(t *testing.T) {
	streamsLoseNothing(t, streamPool(t, nil))
}

// The same with the trigger of the previous release (migration 00015's,
// a NOTIFY per statement, which knows nothing of the polling lock), as
// during a rollout whose enqueuers start before `idemctl migrate`: the
// drainer polls all the same and nothing is lost.
func TestPollingWithThePreviousTrigger(t *testing.T) {
	streamsLoseNothing(t, streamPool(t, func(migrator *pgxpool.Pool) {
		up := previousTrigger(t)
		if _, err := migrator.Exec(context.Background(), "DROP TRIGGER idemd_staged_jobs_wake ON staged_jobs; "+up); err != nil {
			t.Fatal(err)
		}
	}))
}

// previousTrigger is migration 00015's Up section, its goose annotations
// left out.
func previousTrigger(t *testing.T) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS, "00015_staged_jobs_notify_low_id.sql")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	up := text[strings.Index(text, "-- +goose Up"):strings.Index(text, "-- +goose Down")]
	var keep []string
	for _, line := range strings.Split(up, "\n") {
		if !strings.HasPrefix(line, "-- +goose") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// streamPool is a pool on a fresh database with room for the writers and
// the enqueuer, after setup ran as the schema's owner.
func streamPool(t *testing.T, setup func(migrator *pgxpool.Pool)) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 16 // the writers' and the enqueuer's
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if setup != nil {
		setup(dbtest.MigratorPool(t, pool))
	}
	return pool
}

func streamsLoseNothing(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval = 20 * time.Millisecond })
	s.hooks.sweepMarkOnly = true
	s.signals.polling.Init(t)
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	testwait.Until(t, time.Minute, "the low-water mark", func() bool { return s.lw.mark.Load() != fullPass })

	var (
		mu        sync.Mutex
		committed []int64
	)
	const rounds, writers = 3, 8
	for round := range rounds {
		// A stream: writers commit one row at a time until the drainer
		// polls, and a little longer, so commits race the start. They stop
		// between commits, so every committed id is recorded.
		var stopped atomic.Bool
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for n := 0; n < 20_000 && !stopped.Load(); n++ {
					var id int64
					err := pool.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}') RETURNING id`).Scan(&id)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					committed = append(committed, id)
					mu.Unlock()
				}
			})
		}
		if on := s.signals.polling.WaitOrTimeout(t); !on {
			t.Fatalf("round %d: polling stopped before it started", round)
		}
		// Keep streaming for a few polls' worth of commits.
		mu.Lock()
		target := len(committed) + 500
		mu.Unlock()
		testwait.Until(t, time.Minute, "more commits while polling", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(committed) >= target
		})
		stopped.Store(true)
		wg.Wait()
		if on := s.signals.polling.WaitOrTimeout(t); on {
			t.Fatalf("round %d: polling started twice", round)
		}
		testwait.Until(t, time.Minute, "staged_jobs to drain after the handoff", func() bool {
			return count(t, pool, "SELECT count(*) FROM staged_jobs") == 0
		})
	}
	got := stagedIDsInRiver(t, pool)
	slices.Sort(committed)
	if !slices.Equal(got, committed) {
		t.Fatalf("River holds %d jobs for %d committed rows (duplicates or losses)", len(got), len(committed))
	}
	if n := testutil.ToFloat64(s.metrics.pollingStarts); n != rounds {
		t.Errorf("polling started %v times, want %d", n, rounds)
	}
	if n := testutil.ToFloat64(s.metrics.pollingErrors); n != 0 {
		t.Errorf("%v polling errors", n)
	}
	if n := testutil.ToFloat64(s.metrics.notificationGaps.WithLabelValues(GapSwept)); n != 0 {
		t.Errorf("%v swept gaps", n)
	}
}

// The gate's session ends under a polling drainer (the server or the
// network closed it): P goes with it, so the next commits notify at once,
// and the drainer's next take opens a new session and takes P there.
func TestPollingLockDiesWithItsSession(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var g gate
	if err := g.open(ctx, pool.Config().ConnConfig, nil, nil); err != nil {
		t.Fatal(err)
	}
	gen1, err := g.take(ctx)
	if err != nil || gen1 == 0 {
		t.Fatalf("take P: %d, %v", gen1, err)
	}
	var pid int
	g.mu.Lock()
	err = g.conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	g.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := pollLocks(t, pool)
	held := func() bool {
		// Scoped to this test's database: advisory locks carry it.
		return count(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = $1`, p) == 1
	}
	if !held() {
		t.Fatal("P is not held after take")
	}
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Minute, "P to go with the session", func() bool { return !held() })
	// The drainer's next take opens a new session and takes P there.
	gen2, err := g.take(ctx)
	if err != nil || gen2 == 0 || gen2 == gen1 {
		t.Fatalf("take after the session ended: generation %d (was %d), %v", gen2, gen1, err)
	}
	if !held() {
		t.Fatal("P not held on the new session")
	}
	g.close(ctx)
	testwait.Until(t, time.Minute, "P to go with the closed gate", func() bool { return !held() })
}

// A gate whose session could not be opened is retried, at most every
// reopenEvery, and opens once the server accepts it.
func TestGateReopensAfterAFailedOpen(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	bad := pool.Config().ConnConfig.Copy()
	bad.Database = "idemd_no_such_database"
	var g gate
	defer g.close(ctx)
	if err := g.open(ctx, bad, nil, nil); err == nil {
		t.Fatal("open with a database that does not exist succeeded")
	}
	if g.current() != 0 {
		t.Fatal("a failed open left a session")
	}
	now := time.Now()
	if err := g.reopen(ctx, now); err == nil {
		t.Fatal("reopen with the same configuration succeeded")
	}
	g.mu.Lock()
	g.cfg = pool.Config().ConnConfig // the server accepts it now
	g.mu.Unlock()
	if err := g.reopen(ctx, now.Add(reopenEvery/2)); err != nil || g.current() != 0 {
		t.Fatalf("reopen within reopenEvery of the last try: %v, generation %d; want no try", err, g.current())
	}
	if err := g.reopen(ctx, now.Add(reopenEvery)); err != nil || g.current() == 0 {
		t.Fatalf("reopen after reopenEvery: %v, generation %d", err, g.current())
	}
	if gen, err := g.take(ctx); err != nil || gen == 0 {
		t.Fatalf("take on the reopened gate: %d, %v", gen, err)
	}
}

package enqueuer

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// stageEach stages n rows, each in its own transaction (a notification
// each, as an API's requests send).
func stageEach(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for i := range n {
		if _, err := pool.Exec(context.Background(), `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', jsonb_build_object('i', $1::int))`, i); err != nil {
			t.Fatal(err)
		}
	}
}

// gauges are a replica's listener_up and standby.
func gauges(s *Service) (up, standby float64) {
	return testutil.ToFloat64(s.metrics.listenerUp), testutil.ToFloat64(s.metrics.standby)
}

// startReplicas starts n replicas on pool with an hour-long poll (only
// notifications can wake them): the first is the drainer once its
// listener is up, each of the others once it stands by; and each has run
// the start's full pass, which on a loaded machine could otherwise be a
// standby's pass moving rows a test stages next.
func startReplicas(t *testing.T, pool *pgxpool.Pool, n int, change func(*Settings)) []*Service {
	t.Helper()
	var reps []*Service
	for range n {
		s := newService(t, pool, func(st *Settings) {
			st.SweepInterval = time.Hour
			if change != nil {
				change(st)
			}
		})
		s.signals.listenerUp.Init(t)
		s.signals.standby.Init(t)
		s.signals.takeoverAttempt.Init(t)
		s.signals.passed.Init(t)
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop(context.Background()) }) //nolint:errcheck
		if len(reps) == 0 {
			s.signals.listenerUp.WaitOrTimeout(t)
		} else {
			s.signals.standby.WaitOrTimeout(t)
		}
		s.signals.passed.WaitOrTimeout(t)
		reps = append(reps, s)
	}
	return reps
}

// Of two replicas only the drainer listens, wakes for notifications and
// moves the rows; the standby does nothing (it does not even listen). When
// the drainer stops, the standby takes over at once and moves the next
// rows by notification (the poll is an hour away, so nothing else could).
func TestOneReplicaDrainsTheOtherStandsBy(t *testing.T) {
	pool := dbtest.NewPool(t)
	reps := startReplicas(t, pool, 2, nil)
	drainer, standby := reps[0], reps[1]
	if up, sb := gauges(drainer); up != 1 || sb != 0 {
		t.Fatalf("drainer: listener_up %v, standby %v", up, sb)
	}
	if up, sb := gauges(standby); up != 0 || sb != 1 {
		t.Fatalf("standby: listener_up %v, standby %v", up, sb)
	}
	// The server's view: one session holds the lock and none waits for
	// it (a standby tries and returns); after the standby's next attempts
	// still none.
	for range 2 {
		standby.signals.takeoverAttempt.WaitOrTimeout(t)
	}
	if n := count(t, pool, `SELECT count(*) FILTER (WHERE granted) * 10 + count(*) FILTER (WHERE NOT granted) FROM pg_locks
WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n != 10 {
		t.Fatalf("advisory locks granted*10 + waiting: %d, want one granted and none waiting", n)
	}

	stageEach(t, pool, 40)
	testwait.Until(t, time.Minute, "40 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 40 })
	if w := testutil.ToFloat64(standby.metrics.wakeups.WithLabelValues(wakeNotify)); w != 0 {
		t.Fatalf("the standby woke %v times for notifications", w)
	}
	if m := testutil.ToFloat64(standby.metrics.moved); m != 0 {
		t.Fatalf("the standby moved %v rows", m)
	}
	if testutil.ToFloat64(drainer.metrics.wakeups.WithLabelValues(wakeNotify)) == 0 {
		t.Fatal("the drainer was never woken by a notification")
	}

	if err := drainer.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	standby.signals.listenerUp.WaitOrTimeout(t)
	stageEach(t, pool, 10)
	testwait.Until(t, time.Minute, "50 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 50 })
	if testutil.ToFloat64(standby.metrics.wakeups.WithLabelValues(wakePoll)) != 0 {
		t.Fatal("a poll happened with an hour-long interval")
	}
	if testutil.ToFloat64(standby.metrics.wakeups.WithLabelValues(wakeDrainer)) != 1 || testutil.ToFloat64(standby.metrics.takeovers) != 1 {
		t.Fatal("the takeover was not counted or did not ask for a full pass")
	}
	if up, sb := gauges(standby); up != 1 || sb != 0 {
		t.Fatalf("new drainer: listener_up %v, standby %v", up, sb)
	}
	if n := count(t, pool, "SELECT count(DISTINCT metadata->>'idemd_staged_id') FROM river_job"); n != 50 {
		t.Fatalf("%d distinct staged ids in River, want 50", n)
	}
}

// A standby holds no snapshot while it stands by: a statement that waits
// for the drainer lock would hold the one it started with for as long as
// the drainer lives, and the server's xmin horizon could not pass it
// (vacuum would remove nothing in the whole database). Between attempts
// the standby's session is idle without a snapshot, and an attempt that
// shows one is a new statement each time (its xact_start moves), never
// one waiting for a lock.
func TestStandbyHoldsNoSnapshot(t *testing.T) {
	pool := dbtest.NewPool(t)
	reps := startReplicas(t, pool, 2, nil)
	standby := reps[1]
	// The standby's listener session: the one that tries for the lock
	// and does not hold it.
	const sessionSQL = `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE '%pg_try_advisory_lock(hashtextextended(''idemd enqueuer drainer%'
  AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)`
	standby.signals.takeoverAttempt.WaitOrTimeout(t)
	var pid int
	testwait.Until(t, time.Minute, "the standby's session", func() bool {
		return pool.QueryRow(context.Background(), sessionSQL).Scan(&pid) == nil
	})
	var lastStart time.Time
	for i := range 5 {
		if got := standby.signals.takeoverAttempt.WaitOrTimeout(t); got {
			t.Fatal("the standby took the lock while the drainer runs")
		}
		var (
			xmin    *uint32
			start   *time.Time
			waiting bool
		)
		if err := pool.QueryRow(context.Background(), `SELECT backend_xmin::text::bigint, xact_start, coalesce(wait_event_type = 'Lock', false)
FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&xmin, &start, &waiting); err != nil {
			t.Fatalf("sample %d of the standby's session: %v", i, err)
		}
		if waiting {
			t.Fatalf("sample %d: the standby's session waits for a lock inside a statement", i)
		}
		if xmin != nil {
			if start != nil && start.Equal(lastStart) {
				t.Fatalf("sample %d: the standby's session holds a snapshot (xmin %d) across its attempts, since %s", i, *xmin, start)
			}
			if start != nil {
				lastStart = *start
			}
		}
	}
}

// The server ends the drainer's session (a failover, an operator's
// pg_terminate_backend): the standby takes the lock at once, and the old
// drainer reconnects and stands by. The rows staged right after the cut
// move by notification.
func TestDrainerSessionLostHandsOver(t *testing.T) {
	pool := dbtest.NewPool(t)
	reps := startReplicas(t, pool, 2, nil)
	old, standby := reps[0], reps[1]
	// The lock's holder, read from pg_locks: the one granted advisory lock.
	if n := count(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n != 1 {
		t.Fatalf("terminated %d lock holders, want 1", n)
	}
	standby.signals.listenerUp.WaitOrTimeout(t)
	old.signals.standby.WaitOrTimeout(t)
	stageEach(t, pool, 10)
	testwait.Until(t, time.Minute, "10 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 10 })
	if up, sb := gauges(old); up != 0 || sb != 1 {
		t.Fatalf("old drainer: listener_up %v, standby %v", up, sb)
	}
	if up, sb := gauges(standby); up != 1 || sb != 0 {
		t.Fatalf("new drainer: listener_up %v, standby %v", up, sb)
	}
	if testutil.ToFloat64(standby.metrics.wakeups.WithLabelValues(wakePoll)) != 0 || testutil.ToFloat64(old.metrics.wakeups.WithLabelValues(wakePoll)) != 0 {
		t.Fatal("a poll happened with an hour-long interval")
	}
}

// With --poll-only there is no listener and so no election: every replica
// polls, as before.
func TestPollOnlyHasNoDrainer(t *testing.T) {
	pool := dbtest.NewPool(t)
	s := newService(t, pool, func(st *Settings) { st.PollOnly, st.SweepInterval = true, 20*time.Millisecond })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background()) //nolint:errcheck
	stageEach(t, pool, 3)
	testwait.Until(t, time.Minute, "3 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 3 })
	if up, sb := gauges(s); up != 0 || sb != 0 || count(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) != 0 {
		t.Fatal("a poll-only replica took part in the drainer election")
	}
}

// Two enqueuer processes; the drainer is SIGKILLed. The kernel closes its
// sockets, the server ends its session and releases the lock, and the
// other process drains from then on: a row staged after the kill reaches
// River by notification, with --sweep-interval an hour.
func TestSIGKILLedDrainerIsReplaced(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	type proc struct {
		cmd  *exec.Cmd
		addr string
	}
	start := func() proc {
		addr, err := system.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--http-addr="+addr, "--sweep-interval=1h", "--log-format=console")
		cmd.Env = append(cleanEnv(), "DATABASE_URL="+dbURL)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
		return proc{cmd, addr}
	}
	is := func(p proc, series string) bool {
		v, _ := scrape(p.addr, series)
		return v == "1"
	}
	a := start()
	testwait.Until(t, time.Minute, "the first process to drain", func() bool { return is(a, "idemd_enqueuer_listener_up") })
	b := start()
	testwait.Until(t, time.Minute, "the second process to stand by", func() bool { return is(b, "idemd_enqueuer_standby") })
	stageEach(t, pool, 5)
	testwait.Until(t, time.Minute, "5 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 5 })

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	testwait.Until(t, time.Minute, "the second process to take over", func() bool { return is(b, "idemd_enqueuer_listener_up") })
	stageEach(t, pool, 5)
	testwait.Until(t, time.Minute, "10 jobs in River", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 10 })
	if n := count(t, pool, "SELECT count(DISTINCT metadata->>'idemd_staged_id') FROM river_job"); n != 10 {
		t.Fatalf("%d distinct staged ids in River, want 10", n)
	}
	if v, _ := scrape(b.addr, `idemd_enqueuer_wakeups_total{cause="poll"}`); v != "0" {
		t.Fatalf("the survivor polled (%s wake-ups) with an hour-long interval", v)
	}
	if !is(b, "idemd_enqueuer_drainer_takeovers_total") {
		t.Fatal("the takeover was not counted")
	}
}

// scrape reads one sample's value from a process's /metrics; ok is false
// when the process does not answer yet.
func scrape(addr, series string) (string, bool) {
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v, true
		}
	}
	return "", true
}

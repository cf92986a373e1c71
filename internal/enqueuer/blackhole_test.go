package enqueuer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// testBound is --database-timeout in the black-hole tests: small, so a
// pass on a silent network fails soon; a pass must fail well within
// passDeadline, which only bounds a hung test.
const (
	testBound    = 300 * time.Millisecond
	passDeadline = 100 * testBound
)

// runOnceWithin runs one pass, failing the test if it does not return
// within passDeadline.
func runOnceWithin(t *testing.T, s *Service) (res *Result, err error) {
	t.Helper()
	testwait.Returns(t, passDeadline, "an enqueuer pass", func() { res, err = s.RunOnce(context.Background()) })
	return res, err
}

// A pass on a network that went silent fails within its bound, naming
// the call the database did not answer, instead of blocking; once the
// network forwards again, the next passes move the rows, on new
// connections (the silenced ones never answer again).
func TestPassEndsInABlackHoleAndMovesAfterIt(t *testing.T) {
	direct, pool, hole, calls := blackhole.Database(t, testBound)
	s, err := New(Config{Settings: DefaultSettings(), Pool: pool, Calls: calls})
	if err != nil {
		t.Fatal(err)
	}
	stageEach(t, direct, 2)
	testwait.Until(t, time.Minute, "the first rows moved", func() bool {
		runOnceWithin(t, s) //nolint:errcheck // retried until the rows moved
		return len(stagedIDsInRiver(t, direct)) == 2
	})

	hole.BlackHole(tcpproxy.HoleOptions{})
	stageEach(t, direct, 3)
	_, err = runOnceWithin(t, s)
	if !dbcall.IsTimeout(err) {
		t.Fatalf("a pass in the black hole returned %v, want a database timeout", err)
	}
	fault := calls.Fault()
	if fault == nil || !strings.Contains(fault.Error(), "database did not answer within "+config.FormatDuration(testBound)+": enqueuer") {
		t.Fatalf("Fault (what /readyz says) = %v, want the enqueuer's call and the bound", fault)
	}

	hole.Heal()
	testwait.Until(t, time.Minute, "every staged row moved after the black hole", func() bool {
		runOnceWithin(t, s) //nolint:errcheck // a pass may meet a pooled connection the hole silenced
		return len(stagedIDsInRiver(t, direct)) == 5
	})
	if f := calls.Fault(); f != nil {
		t.Fatalf("the database answers again but Fault still says %v", f)
	}
	if n := count(t, direct, "SELECT count(*) FROM staged_jobs"); n != 0 {
		t.Fatalf("%d rows left staged", n)
	}
}

// A running enqueuer whose every connection went silent (the pool's, the
// listener's, the polling gate's) is moving again after the network comes
// back, without a restart: the listener, cut off, is found by its
// self-check and reconnects, takes the drainer lock again once the server
// ended the silenced session, and rows staged during the hole reach
// River exactly once.
func TestServiceRecoversFromABlackHole(t *testing.T) {
	direct, pool, hole, calls := blackhole.Database(t, testBound)
	s, err := New(Config{Settings: DefaultSettings(), Pool: pool, Calls: calls})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.ListenerCheckInterval = testBound
	s.cfg.ListenerCheckTimeout = testBound
	s.signals.listenerUp.Init(t)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testwait.Returns(t, passDeadline, "Stop", func() { s.Stop(context.Background()) }) //nolint:errcheck
	})
	s.signals.listenerUp.WaitOrTimeout(t)
	stageEach(t, direct, 2)
	testwait.Until(t, time.Minute, "the first rows moved", func() bool { return len(stagedIDsInRiver(t, direct)) == 2 })

	hole.BlackHole(tcpproxy.HoleOptions{})
	stageEach(t, direct, 3)
	testwait.Until(t, time.Minute, "a call that ran out of its bound", func() bool { return calls.Fault() != nil })
	testwait.Until(t, time.Minute, "the listener found down", func() bool { return testutil.ToFloat64(s.metrics.listenerUp) == 0 })

	// The server's keepalives end the sessions of a client that stopped
	// answering; the drainer lock goes with the listener's.
	hole.EndServerSessions()
	hole.Heal()
	testwait.Until(t, time.Minute, "every staged row moved after the black hole", func() bool { return len(stagedIDsInRiver(t, direct)) == 5 })
	s.signals.listenerUp.WaitOrTimeout(t)
	testwait.Until(t, time.Minute, "the degraded mode ended", func() bool { return calls.Fault() == nil })
	ids := stagedIDsInRiver(t, direct)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			t.Fatalf("staged id %d reached River twice: %v", ids[i], ids)
		}
	}
}

// The sessions that hold the drainer and polling locks set the server's
// keepalives (dbcall.ServerKeepalives), so the server ends a vanished replica's
// session, and releases its locks, as soon as any other's.
func TestLockSessionsSetTheServersKeepalives(t *testing.T) {
	for _, s := range dbcall.ServerKeepalives {
		if !strings.Contains(drainerSessionSQL, "SET "+s.Name+" = "+s.Value+";") &&
			!strings.Contains(drainerSessionSQL, "SET "+s.Name+" = '"+s.Value+"'") {
			t.Errorf("drainerSessionSQL does not set %s to %s:\n%s", s.Name, s.Value, drainerSessionSQL)
		}
	}
	// And the server takes them: the session's settings, read back.
	pool := dbtest.NewPool(t)
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(context.Background(), "RESET ALL") //nolint:errcheck // a pooled connection of this test only
	if _, err := conn.Exec(context.Background(), drainerSessionSQL); err != nil {
		t.Fatal(err)
	}
	for _, s := range dbcall.ServerKeepalives {
		var got string
		if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", s.Name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != s.Value {
			t.Errorf("%s = %q after drainerSessionSQL, want %q", s.Name, got, s.Value)
		}
	}
}

package enqueuer

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// A standby's attempts at the drainer lock prove its session: while the
// drainer holds the lock, attempts come back and the same session stands
// by. When its connection goes silent, the next attempt gets no answer
// within its bound, the standby connects again and stands by on a live
// session, and it takes over when the drainer goes. A standby that waited
// on the silent connection (in pg_advisory_lock, as it once did) never
// took over.
func TestStandbyOnASilencedConnectionStandsByAgainAndTakesOver(t *testing.T) {
	direct, pool, hole, calls := blackhole.Database(t, testBound)
	start := func(p *pgxpool.Pool) (*Service, func()) {
		t.Helper()
		s, err := New(Config{Settings: DefaultSettings(), Pool: p, Calls: calls})
		if err != nil {
			t.Fatal(err)
		}
		// An attempt every testBound: a silent one is found a bound later.
		s.cfg.TakeoverInterval = testBound
		s.signals.listenerUp.Init(t)
		s.signals.standby.Init(t)
		s.signals.takeoverAttempt.Init(t)
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		stop := func() {
			once.Do(func() {
				testwait.Returns(t, passDeadline, "Stop", func() {
					if err := s.Stop(context.Background()); err != nil {
						t.Errorf("stop: %v", err)
					}
				})
			})
		}
		t.Cleanup(stop)
		return s, stop
	}
	// The drainer reaches the database directly, the standby through the
	// black hole.
	drainer, stopDrainer := start(direct)
	drainer.signals.listenerUp.WaitOrTimeout(t)
	standby, _ := start(pool)
	standby.signals.standby.WaitOrTimeout(t)

	// The standby's session: the one whose last statement is an attempt at
	// the lock and which does not hold it.
	standbySession := func() int {
		t.Helper()
		var pid int
		if err := direct.QueryRow(context.Background(), `SELECT coalesce(min(pid), 0) FROM pg_stat_activity
			WHERE query = $1 AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)`,
			drainerTryLockSQL).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	if got := standby.signals.takeoverAttempt.WaitOrTimeout(t); got {
		t.Fatal("the standby took the lock the drainer holds")
	}
	first := standbySession()
	for range 3 {
		if got := standby.signals.takeoverAttempt.WaitOrTimeout(t); got {
			t.Fatal("the standby took the lock the drainer holds")
		}
	}
	if w := standbySession(); first == 0 || w != first {
		t.Fatalf("the standby's session changed across attempts that came back: backend %d, then %d", first, w)
	}

	// Silent: the standby's session and its pool's connections stop
	// answering; the server ends the silenced sessions, as its keepalives
	// would (the standby's wait goes with it); new connections forward.
	hole.BlackHole(tcpproxy.HoleOptions{})
	hole.EndServerSessions()
	hole.Heal()
	standby.signals.standby.WaitOrTimeout(t)
	if up := testutil.ToFloat64(standby.metrics.listenerUp); up != 0 {
		t.Fatalf("the standby's listener_up is %v while it stands by", up)
	}

	stopDrainer()
	standby.signals.listenerUp.WaitOrTimeout(t)
	if n := testutil.ToFloat64(standby.metrics.takeovers); n != 1 {
		t.Fatalf("takeovers %v, want 1", n)
	}
}

package enqueuer

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/testing/testwait"
)

// A standby waits for the drainer lock in rounds that prove its session:
// while the drainer holds the lock, rounds end and the same session waits
// on. When its connection goes silent, the round in flight gets no answer,
// the standby connects again and stands by on a live session, and it takes
// over when the drainer goes. Without the rounds it waited on the silent
// connection for ever and never took over.
func TestStandbyOnASilencedConnectionStandsByAgainAndTakesOver(t *testing.T) {
	direct, pool, hole, calls := silentSetup(t)
	start := func(p *pgxpool.Pool) (*Service, func()) {
		t.Helper()
		s, err := New(Config{Settings: DefaultSettings(), Pool: p, Calls: calls})
		if err != nil {
			t.Fatal(err)
		}
		// Rounds of testBound: a silent round is found after two bounds.
		s.cfg.ListenerCheckInterval = testBound
		s.signals.listenerUp.Init(t)
		s.signals.standby.Init(t)
		s.signals.standbyRound.Init(t)
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

	// The backend waiting for the lock (between two rounds none is: poll).
	waiter := func() int {
		t.Helper()
		var pid int
		testwait.Until(t, passDeadline, "the standby's wait", func() bool {
			if err := direct.QueryRow(context.Background(), `SELECT coalesce(min(pid), 0) FROM pg_locks
				WHERE locktype = 'advisory' AND NOT granted`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			return pid != 0
		})
		return pid
	}
	standby.signals.standbyRound.WaitOrTimeout(t)
	first := waiter()
	for range 3 {
		standby.signals.standbyRound.WaitOrTimeout(t)
	}
	if w := waiter(); w != first {
		t.Fatalf("the standby's session changed across rounds that ended with the lock taken: backend %d, then %d", first, w)
	}

	// Silent: the standby's session and its pool's connections stop
	// answering; the server ends the silenced sessions, as its keepalives
	// would (the standby's wait goes with it); new connections forward.
	hole.Silence()
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

package enqueuer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// After a pass the loop waits --sweep-interval for a wake-up, or the poll's
// wait while the drainer polls; after failed passes the skeleton backs off
// from 200 ms up to 10 s.
func TestNextPass(t *testing.T) {
	s := &Service{cfg: Config{Settings: Settings{SweepInterval: 2 * time.Second}}}
	if d := s.nextPass(&Result{}); d != 2*time.Second {
		t.Fatalf("after a pass: %s, want the poll interval", d)
	}
	s.loop.poll = pollState{polling: true, wait: 3 * time.Millisecond}
	if d := s.nextPass(&Result{}); d != 3*time.Millisecond {
		t.Fatalf("after a poll: %s, want the poll's wait", d)
	}
	if c := backoff.Ceiling(1, passRetry.Base, passRetry.Max); c != 200*time.Millisecond {
		t.Fatalf("first retry's ceiling %s", c)
	}
	if c := backoff.Ceiling(20, passRetry.Base, passRetry.Max); c != 10*time.Second {
		t.Fatalf("ceiling after 20 failures %s, want the 10s cap", c)
	}
}

// A failed pass asks for a full pass and counts a retry wake-up: the
// failed drain's rows may lie anywhere from its floor on. (The loop hears
// no wake-up during the backoff that follows: lifecycle's
// TestLoopRetryIgnoresWakeUps.)
func TestFailedPassAsksForAFullPass(t *testing.T) {
	pool := dbtest.NewPool(t)
	s := newService(t, pool)
	s.loop.begun = true // not the start's full pass
	s.floor.lower(500)
	pool.Close() // every batch fails
	if _, err := s.pass(context.Background(), lifecycle.Stop{}); err == nil {
		t.Fatal("a pass on a closed pool succeeded")
	}
	if spec, ok := s.floor.take(1000); !ok || spec.from != fullPass {
		t.Fatalf("the retry's pass: %+v %v, want a full pass", spec, ok)
	}
	if n := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues(wakeRetry)); n != 1 {
		t.Fatalf("retry wake-ups counted: %v, want 1", n)
	}
}

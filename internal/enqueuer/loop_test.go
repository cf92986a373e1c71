package enqueuer

import (
	"errors"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/backoff"
)

// After a pass the loop waits --poll-interval for a wake-up; after failed
// passes, backoff.Delay between 0 and the ceiling for that many failures.
func TestNextPass(t *testing.T) {
	if d := nextPass(nil, 0, 2*time.Second); d != 2*time.Second {
		t.Fatalf("after a pass: %s, want the poll interval", d)
	}
	failed := errors.New("connection refused")
	for failures := 1; failures <= 10; failures++ {
		ceiling := backoff.Ceiling(failures, retryBase, retryMax)
		for range 100 {
			if d := nextPass(failed, failures, 2*time.Second); d < 0 || d >= ceiling {
				t.Fatalf("after %d failed passes: %s, want [0, %s)", failures, d, ceiling)
			}
		}
	}
	if c := backoff.Ceiling(1, retryBase, retryMax); c != 200*time.Millisecond {
		t.Fatalf("first retry's ceiling %s", c)
	}
	if c := backoff.Ceiling(20, retryBase, retryMax); c != 10*time.Second {
		t.Fatalf("ceiling after 20 failures %s, want the 10s cap", c)
	}
}

// A failed pass asks for a full pass and holds wake-ups for its backoff:
// notifications then lower the floor, counted, but do not wake the loop,
// which would otherwise turn the backoff into a hot loop of failing
// passes; the retry's pass takes everything they asked for.
func TestWakesAreHeldDuringARetrysBackoff(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{metrics: m, wake: make(chan struct{}, 1), floor: newFloor()}
	pending := func() bool {
		select {
		case <-s.wake:
			return true
		default:
			return false
		}
	}
	s.signal(wakeNotify) // a wake-up left over from the failed pass
	s.retryAfter(time.Hour)
	if pending() {
		t.Fatal("a wake-up pending before the failure survived the backoff's start")
	}
	s.floor.lower(500)
	s.signal(wakeNotify)
	if pending() {
		t.Fatal("a notification woke the loop during the backoff")
	}
	if spec, ok := s.floor.take(1000); !ok || spec.from != fullPass {
		t.Fatalf("the retry's pass: %+v %v, want a full pass", spec, ok)
	}
	s.wakeHeld = time.Now().Add(-time.Millisecond) // the backoff is over
	s.signal(wakeNotify)
	if !pending() {
		t.Fatal("a notification after the backoff did not wake the loop")
	}
}

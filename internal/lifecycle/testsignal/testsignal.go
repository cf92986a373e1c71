// Package testsignal is how a service tells its tests that it reached a
// point: a service holds a struct of Signals, a test calls Init on the ones
// it waits for, and the service's Signal calls cost nothing in production
// (an uninitialised Signal drops its value). Tests wait with WaitOrTimeout,
// whose deadline only bounds a hung test; no test sleeps hoping work is done.
package testsignal

import (
	"sync/atomic"
	"testing"
	"time"
)

// Timeout bounds every wait; it is generous because CI machines are slow.
const Timeout = 30 * time.Second

// Capacity is how many values an initialised signal holds for its test. A
// test that lets more pile up fails: the values it never read are ones it
// may have meant to wait for.
const Capacity = 1000

// Signal carries values of T from a service to a test.
type Signal[T any] struct {
	ch      chan T
	dropped atomic.Int64
}

// Init makes the signal record values for tb; call it before the service
// starts. If the service signals while Capacity values are waiting, the
// value is dropped (the service never blocks on its test) and tb fails
// when it ends, saying how many were dropped. The failure is reported from
// tb's cleanup, not from the service's goroutine, where a test must not
// stop.
func (s *Signal[T]) Init(tb testing.TB) {
	tb.Helper()
	s.ch = make(chan T, Capacity)
	s.dropped.Store(0)
	tb.Cleanup(func() {
		if n := s.dropped.Load(); n > 0 {
			tb.Errorf("testsignal: %d values dropped: more than %d signalled and not read (read them, or do not Init the signal)", n, Capacity)
		}
	})
}

// Signal records v if a test initialised the signal; otherwise it does
// nothing. It never blocks: past Capacity unread values it drops v and
// counts it, and the test fails (see Init).
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
		s.dropped.Add(1)
	}
}

// WaitOrTimeout returns the next value, failing the test after Timeout.
func (s *Signal[T]) WaitOrTimeout(tb testing.TB) T {
	tb.Helper()
	if s.ch == nil {
		tb.Fatal("testsignal: WaitOrTimeout on a signal that was not initialised")
	}
	select {
	case v := <-s.ch:
		return v
	case <-time.After(Timeout):
		tb.Fatalf("testsignal: no signal within %s", Timeout)
		panic("unreachable")
	}
}

// Package testsignal is how a service tells its tests that it reached a
// point: a service holds a struct of Signals, a test calls Init on the ones
// it waits for, and the service's Signal calls cost nothing in production
// (an uninitialised Signal drops its value). Tests wait with WaitOrTimeout,
// whose deadline only bounds a hung test; no test sleeps hoping work is done.
package testsignal

import (
	"testing"
	"time"
)

// Timeout bounds every wait; it is generous because CI machines are slow.
const Timeout = 30 * time.Second

// Signal carries values of T from a service to a test.
type Signal[T any] struct {
	ch chan T
}

// Init makes the signal record values; call it before the service starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, 1000) }

// Signal records v if a test initialised the signal; otherwise it does
// nothing. It never blocks: a test that does not read loses values beyond
// the buffer, not the service's progress.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
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

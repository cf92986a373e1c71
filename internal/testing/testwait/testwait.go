// Package testwait is how tests wait for work done by another goroutine or
// process: poll a condition until it holds, with a deadline that only bounds
// a hung test. Tests never sleep a fixed time hoping the work is done, and
// never assert on how long it took.
package testwait

import (
	"testing"
	"time"
)

// Until polls cond every few milliseconds until it holds, and fails the test
// naming what it waited for if timeout passes first.
func Until(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Returns runs f and fails the test naming what it waited for unless f
// returns within timeout: for a call that must not hang (a pass on a
// database that stopped answering). f goes on running after a failure.
func Returns(tb testing.TB, timeout time.Duration, what string, f func()) {
	tb.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		tb.Fatalf("timed out after %s waiting for %s to return", timeout, what)
	}
}

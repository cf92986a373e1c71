package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/idemd/idemd/internal/backoff"
)

// Loop is every loop a service runs: its main loop (Skeleton builds it
// from the service's pass) and the loops beside it (the enqueuer's sweep,
// backlog gauges and listener, the reaper's lease heartbeat). It runs Pass
// First after it starts, then again whenever Wake delivers or the delay
// chosen after the last pass has passed, until it is stopped. A pass
// always runs to its end: Loop only looks at stop between passes.
type Loop struct {
	// Pass is one unit of the loop's work; it logs its own failures.
	Pass func(ctx context.Context) error
	// Next says how long to wait after a successful pass. Required.
	Next func() time.Duration
	// Retry is the wait after a failed pass: backoff.Delay from Base up to
	// Max over the failures in a row. During it Wake is not heard, so
	// wake-ups cannot turn the backoff into a hot loop of failing passes.
	// The zero Retry leaves the wait to Next (the reaper's schedule).
	Retry Retry
	// Wake, optional, starts a pass before Next's delay has passed.
	Wake <-chan struct{}
	// Passed, optional, is told of every successful pass (readiness).
	Passed func(time.Time)
	// First delays the first pass (zero: at once).
	First time.Duration
}

// Retry is the backoff after failed passes.
type Retry struct{ Base, Max time.Duration }

// delay is the wait after failures failed passes in a row, with
// ok=false for the zero Retry.
func (r Retry) delay(failures int) (d time.Duration, ok bool) {
	if r.Base <= 0 {
		return 0, false
	}
	return backoff.Delay(failures, r.Base, r.Max, nil), true
}

// Run runs the loop until stop is closed or ctx ends; give it to
// Runner.Start, or to Beside. A nil stop is never closed.
func (l Loop) Run(ctx context.Context, stop <-chan struct{}) {
	timer := time.NewTimer(l.First)
	defer timer.Stop()
	failures := 0
	wake := l.Wake
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-wake:
		case <-timer.C:
		}
		select {
		case <-stop: // stop and a wake-up arrived together: stop wins
			return
		default:
		}
		err := l.Pass(ctx)
		wait := time.Duration(0)
		wake = l.Wake
		if err != nil {
			failures++
			d, ok := l.Retry.delay(failures)
			if ok {
				wait, wake = d, nil
			} else {
				wait = l.Next()
			}
		} else {
			failures = 0
			if l.Passed != nil {
				l.Passed(time.Now())
			}
			wait = l.Next()
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// Beside runs loops in the background until the returned stop is called,
// which cancels them and waits for them to return: the loops that run
// beside a service's main loop, or beside one run (a lease's heartbeat).
// They have no unit of work worth finishing, so stopping cancels them.
func Beside(ctx context.Context, loops ...Loop) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() { l.Run(ctx, nil) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

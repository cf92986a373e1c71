package lifecycle

import (
	"context"
	"time"
)

// Loop is the body every long-running service gives its Runner: one pass
// (the service's runOnce) First after start, then one whenever Wake delivers or the
// delay Next chose has passed, until stop is closed. A pass always runs to
// its end: Loop only looks at stop between passes, and the pass itself
// watches stop between its units (batches, requests).
type Loop struct {
	// Pass is one runOnce. Its error is handed to Next, which decides when
	// to try again; Pass logs its own failures.
	Pass func(ctx context.Context) error
	// Next says how long to wait after a pass; failures counts consecutive
	// failed passes (0 after a success). Required.
	Next func(err error, failures int) time.Duration
	// Wake, optional, starts a pass before Next's delay has passed.
	Wake <-chan struct{}
	// Passed, optional, is told of every successful pass (readiness).
	Passed func(time.Time)
	// First delays the first pass (zero: at once), for a service whose
	// passes keep a schedule of their own (the reaper's cron times).
	First time.Duration
}

// Run runs the loop; give it to Runner.Start.
func (l Loop) Run(ctx context.Context, stop <-chan struct{}) {
	timer := time.NewTimer(l.First)
	defer timer.Stop()
	failures := 0
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-l.Wake:
		case <-timer.C:
		}
		select {
		case <-stop: // stop and a wake-up arrived together: stop wins
			return
		default:
		}
		err := l.Pass(ctx)
		if err != nil {
			failures++
		} else {
			failures = 0
			if l.Passed != nil {
				l.Passed(time.Now())
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(l.Next(err, failures))
	}
}

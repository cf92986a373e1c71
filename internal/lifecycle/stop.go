package lifecycle

import "context"

// Stop is what a pass knows of the request to stop: Stop, or the end of
// Start's context, asks it to end after its current unit (batch, request)
// without cancelling that unit. A one-shot pass (RunOnce, --once) is never
// asked: SIGTERM cancels its context instead, and it runs with nothing
// beside it (no listener, no sweep, no earlier pass), which is how a pass
// knows to look at everything.
type Stop struct {
	ch      <-chan struct{}
	oneShot bool
}

// OneShot is the Stop of a pass run alone (runOnce).
var OneShot = Stop{oneShot: true}

// Requested reports whether the pass is asked to end after this unit.
func (s Stop) Requested() bool {
	select {
	case <-s.ch:
		return true
	default:
		return false
	}
}

// Done is closed when the pass is asked to stop (nil, never closed, for
// a one-shot pass), for a pass that waits.
func (s Stop) Done() <-chan struct{} { return s.ch }

// OneShot reports whether the pass runs alone (runOnce).
func (s Stop) OneShot() bool { return s.oneShot }

// Context is ctx, also cancelled when the stop is requested: for the parts
// of a pass that have nothing to finish (a wait for a lease, a count).
func (s Stop) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	soft, cancel := context.WithCancel(ctx)
	if s.ch == nil {
		return soft, cancel
	}
	go func() { // ends with soft, at the latest when cancel is called
		select {
		case <-s.ch:
			cancel()
		case <-soft.Done():
		}
	}()
	return soft, cancel
}

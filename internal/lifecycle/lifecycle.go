// Package lifecycle is the Start/Stop shape the long-running daemons share.
// Their work runs in the background on a context of its own. Stop first
// asks the work to finish its current unit (it closes the stop channel),
// waits for that until the caller's deadline, and only then cancels the
// work's context, so a batch in progress commits or rolls back whole
// instead of being cut off by the shutdown signal itself.
package lifecycle

import (
	"context"
	"fmt"
	"sync"
)

// Runner runs one piece of background work at a time. The zero value is
// ready to use; Name prefixes its errors.
type Runner struct {
	Name string

	mu      sync.Mutex
	started bool
	stop    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start runs work in a goroutine and returns at once. work's context keeps
// ctx's values but not its cancellation: it ends only when a Stop's
// deadline passes. work must return soon after stop is closed.
func (r *Runner) Start(ctx context.Context, work func(ctx context.Context, stop <-chan struct{})) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return fmt.Errorf("%s: already started", r.Name)
	}
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop, done := make(chan struct{}), make(chan struct{})
	r.started, r.stop, r.cancel, r.done = true, stop, cancel, done
	go func() {
		defer close(done)
		work(workCtx, stop)
	}()
	return nil
}

// Stop asks the work to finish and waits for it until ctx ends, then
// cancels it and waits for it to return. It reports an error when ctx ended
// first (the work was cut short). Stop without Start does nothing;
// concurrent Stops all wait; a stopped Runner may be started again.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	done, cancel := r.done, r.cancel
	r.mu.Unlock()

	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("%s: stop: current work aborted: %w", r.Name, ctx.Err())
	}
	cancel()
	<-done

	r.mu.Lock()
	if r.done == done {
		r.started = false
	}
	r.mu.Unlock()
	return err
}

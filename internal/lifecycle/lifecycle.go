// Package lifecycle is the Start/Stop shape every idemd service shares
// (docs/architecture.md). A service's work runs in the background on a
// context of its own. Stopping first asks the work to finish its current
// unit (it closes the stop channel), waits for that until the caller's
// deadline, and only then cancels the work's context, so a batch in progress
// commits or rolls back whole instead of being cut off by the shutdown
// signal itself.
//
// Two things ask the work to stop, with the same meaning: Stop, and the end
// of the context given to Start. Only Stop's deadline cancels the work.
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

// Start runs work in a goroutine and returns at once. When ctx ends, work is
// asked to stop (stop is closed) as by Stop; work's context keeps ctx's
// values but is cancelled only when a Stop's deadline passes. work must
// return soon after stop is closed.
func (r *Runner) Start(ctx context.Context, work func(ctx context.Context, stop <-chan struct{})) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return fmt.Errorf("%s: already started", r.Name)
	}
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop, done := make(chan struct{}), make(chan struct{})
	r.started, r.stop, r.cancel, r.done = true, stop, cancel, done
	unwatch := context.AfterFunc(ctx, func() { r.requestStop(stop) })
	go func() {
		defer close(done)
		defer unwatch()
		work(workCtx, stop)
	}()
	return nil
}

// requestStop closes stop once, whoever asks first.
func (r *Runner) requestStop(stop chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-stop:
	default:
		close(stop)
	}
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
	stop, done, cancel := r.stop, r.done, r.cancel
	r.mu.Unlock()
	r.requestStop(stop)

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

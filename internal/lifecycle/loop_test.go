package lifecycle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// The loop runs a pass at once and another on each wake-up, reports the
// successful ones, and after a failed pass waits Retry's backoff instead
// of Next's delay.
func TestLoopPassesWakeUpsAndFailures(t *testing.T) {
	wake := make(chan struct{})
	passes := make(chan int)
	boom := errors.New("boom")
	results := []error{nil, boom, boom, nil}
	nexts, passed, n := 0, 0, 0
	l := Loop{
		Pass: func(context.Context) error {
			err := results[n%len(results)]
			n++
			passes <- n
			return err
		},
		Next: func() time.Duration {
			nexts++
			return time.Hour // only wake-ups start further passes
		},
		// The failed passes are retried by the backoff alone.
		Retry:  Retry{Base: time.Nanosecond, Max: time.Nanosecond},
		Wake:   wake,
		Passed: func(time.Time) { passed++ },
	}
	var r Runner
	if err := r.Start(context.Background(), l.Run); err != nil {
		t.Fatal(err)
	}
	<-passes // the first pass needs no wake-up
	wake <- struct{}{}
	for range 3 { // the wake-up's pass fails, the retry fails, the next succeeds
		<-passes
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if nexts != 2 || passed != 2 {
		t.Fatalf("Next called %d times and Passed %d, want 2 and 2 (once per successful pass)", nexts, passed)
	}
}

// During the backoff after a failed pass a wake-up starts nothing: it
// stays pending for the pass after the backoff.
func TestLoopRetryIgnoresWakeUps(t *testing.T) {
	wake := make(chan struct{}, 1)
	passes := make(chan struct{}, 2)
	l := Loop{
		Pass:  func(context.Context) error { passes <- struct{}{}; return errors.New("boom") },
		Next:  func() time.Duration { return time.Hour },
		Retry: Retry{Base: time.Hour, Max: time.Hour},
		Wake:  wake,
	}
	var r Runner
	if err := r.Start(context.Background(), l.Run); err != nil {
		t.Fatal(err)
	}
	<-passes
	wake <- struct{}{}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(passes) != 0 || len(wake) != 1 {
		t.Fatalf("a wake-up during the backoff started a pass (passes %d, pending wake-ups %d)", len(passes), len(wake))
	}
}

// Beside runs its loops until its stop is called, which returns only
// when they have.
func TestBesideStops(t *testing.T) {
	ran := make(chan struct{}, 1)
	var running sync.WaitGroup
	running.Add(1)
	stop := Beside(context.Background(), Loop{
		Pass: func(ctx context.Context) error {
			select {
			case ran <- struct{}{}:
				running.Done()
			default:
			}
			<-ctx.Done()
			return nil
		},
		Next: func() time.Duration { return time.Hour },
	})
	running.Wait()
	stop() // goleak (TestMain) fails the package if a loop outlived it
}

// Next's delay starts the next pass without a wake-up.
func TestLoopNextDelay(t *testing.T) {
	passes := make(chan struct{}, 3)
	l := Loop{
		Pass: func(context.Context) error {
			select { // never block: the loop keeps passing until stopped
			case passes <- struct{}{}:
			default:
			}
			return nil
		},
		Next: func() time.Duration { return time.Nanosecond },
	}
	var r Runner
	if err := r.Start(context.Background(), l.Run); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		<-passes
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// With First set, the first pass waits for it, or for a wake-up.
func TestLoopFirstDelay(t *testing.T) {
	wake := make(chan struct{})
	passes := make(chan struct{}, 1)
	l := Loop{
		Pass:  func(context.Context) error { passes <- struct{}{}; return nil },
		Next:  func() time.Duration { return time.Hour },
		Wake:  wake,
		First: time.Hour,
	}
	var r Runner
	if err := r.Start(context.Background(), l.Run); err != nil {
		t.Fatal(err)
	}
	select {
	case <-passes:
		t.Fatal("a pass ran before First or a wake-up")
	default:
	}
	wake <- struct{}{}
	<-passes
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The loop runs a pass at once, another on each wake-up, hands each pass's
// error and the count of consecutive failures to Next, reports successes,
// and returns when stopped.
func TestLoopPassesWakeUpsAndFailures(t *testing.T) {
	wake := make(chan struct{})
	passes := make(chan int)
	boom := errors.New("boom")
	results := []error{nil, boom, boom, nil}
	var seen []int
	passed := 0
	n := 0
	l := Loop{
		Pass: func(context.Context) error {
			err := results[n%len(results)]
			n++
			passes <- n
			return err
		},
		Next: func(err error, failures int) time.Duration {
			seen = append(seen, failures)
			return time.Hour // only wake-ups start further passes
		},
		Wake:   wake,
		Passed: func(time.Time) { passed++ },
	}
	var r Runner
	if err := r.Start(context.Background(), l.Run); err != nil {
		t.Fatal(err)
	}
	<-passes // the first pass needs no wake-up
	for range 3 {
		wake <- struct{}{}
		<-passes
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2, 0}; len(seen) != len(want) || seen[0] != 0 || seen[1] != 1 || seen[2] != 2 || seen[3] != 0 {
		t.Fatalf("failures handed to Next = %v, want %v", seen, want)
	}
	if passed != 2 {
		t.Fatalf("Passed called %d times, want 2", passed)
	}
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
		Next: func(error, int) time.Duration { return time.Nanosecond },
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
		Next:  func(error, int) time.Duration { return time.Hour },
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

package lifecycle

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The work sees stop first and may finish its unit: its context is not
// cancelled while it does.
func TestStopLetsTheWorkFinish(t *testing.T) {
	var r Runner
	finished := make(chan bool, 1)
	if err := r.Start(context.Background(), func(ctx context.Context, stop <-chan struct{}) {
		<-stop
		finished <- ctx.Err() == nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !<-finished {
		t.Fatal("the work's context was cancelled before it finished")
	}
}

// Work that ignores stop is cancelled when Stop's deadline passes, and Stop
// says so.
func TestStopDeadlineCancelsTheWork(t *testing.T) {
	r := Runner{Name: "svc"}
	if err := r.Start(context.Background(), func(ctx context.Context, _ <-chan struct{}) { <-ctx.Done() }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := r.Stop(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop: %v, want the deadline's error", err)
	}
}

// Start's context ending asks the work to stop, as Stop does, but does not
// cancel the work's context: the current unit still finishes.
func TestStartContextEndingStopsWithoutCancelling(t *testing.T) {
	var r Runner
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan error, 1)
	if err := r.Start(ctx, func(wctx context.Context, stop <-chan struct{}) {
		<-stop
		seen <- wctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-seen; err != nil {
		t.Fatalf("work context ended with Start's: %v", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStartTwiceFailsAndRestartWorks(t *testing.T) {
	r := Runner{Name: "svc"}
	work := func(_ context.Context, stop <-chan struct{}) { <-stop }
	if err := r.Start(context.Background(), work); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), work); err == nil {
		t.Fatal("second Start succeeded")
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), work); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after Stop: %v", err)
	}
}

// Concurrent Stops all return only once the work has.
func TestConcurrentStopsAllWait(t *testing.T) {
	var r Runner
	release := make(chan struct{})
	returned := make(chan struct{})
	if err := r.Start(context.Background(), func(_ context.Context, stop <-chan struct{}) {
		<-stop
		<-release
		close(returned)
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	early := make(chan struct{}, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Stop(context.Background())
			select {
			case <-returned:
			default:
				early <- struct{}{}
			}
		}()
	}
	close(release)
	wg.Wait()
	if len(early) > 0 {
		t.Fatalf("%d Stops returned before the work did", len(early))
	}
}

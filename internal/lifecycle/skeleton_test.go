package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/opshttp"
)

type passRes struct{ n int }

// skeletonFor is a Skeleton whose passes return results in turn and tell
// the test of each stop they saw.
func skeletonFor(t *testing.T, results []error, stops chan<- Stop) (*Skeleton[*passRes], *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	i := 0
	return &Skeleton[*passRes]{
		Name:   "svc",
		Logger: zap.New(core),
		Pass: func(_ context.Context, stop Stop) (*passRes, error) {
			err := results[i%len(results)]
			i++
			stops <- stop
			return &passRes{n: i}, err
		},
		Next:         func(*passRes) time.Duration { return time.Hour },
		Summary:      "svc pass",
		SummaryLevel: zapcore.InfoLevel,
		Summarize: func(last *passRes, _ error) ([]zap.Field, bool) {
			return []zap.Field{zap.Int("n", last.n)}, last.n%2 == 1
		},
	}, logs
}

// RunOnce runs the pass alone (OneShot) and logs its summary line when the
// pass finds it worth one, and always after a failure, at error level.
func TestSkeletonRunOnceAndSummaryLine(t *testing.T) {
	stops := make(chan Stop, 3)
	k, logs := skeletonFor(t, []error{nil, nil, errors.New("boom")}, stops)
	for range 3 {
		if _, err := k.RunOnce(context.Background()); err != nil && err.Error() != "boom" {
			t.Fatal(err)
		}
		if st := <-stops; !st.OneShot() || st.Requested() || st.Done() != nil {
			t.Fatalf("RunOnce's stop %+v, want OneShot, never requested", st)
		}
	}
	lines := logs.FilterMessage("svc pass").All()
	if len(lines) != 2 || lines[0].Level != zapcore.InfoLevel || lines[0].ContextMap()["n"] != int64(1) ||
		lines[1].Level != zapcore.ErrorLevel || lines[1].ContextMap()["error"] != "boom" {
		t.Fatalf("summary lines %+v, want pass 1 at info (pass 2 not worth one) and failed pass 3 at error", lines)
	}
}

// A pass the shutdown cut short is logged at info, not as a failure.
func TestSkeletonShutdownIsNotAFailure(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	k := &Skeleton[*passRes]{
		Logger:    zap.New(core),
		Summary:   "svc pass",
		Pass:      func(ctx context.Context, _ Stop) (*passRes, error) { return &passRes{}, ctx.Err() },
		Summarize: func(*passRes, error) ([]zap.Field, bool) { return nil, false },
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := k.RunOnce(ctx); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if l := logs.All(); len(l) != 1 || l[0].Level != zapcore.InfoLevel {
		t.Fatalf("lines %+v, want one at info", l)
	}
}

// Start marks readiness started with the service's MaxPassAge, passes see
// a stop that Stop requests, successful passes mark readiness when
// ReadyAfter accepts them, and Finally runs after the loops beside the
// main loop have stopped.
func TestSkeletonStartReadinessAndFinally(t *testing.T) {
	stops := make(chan Stop, 1)
	k, _ := skeletonFor(t, []error{nil}, stops)
	ready := &opshttp.Readiness{}
	k.Ready = ready
	k.MaxPassAge = func() time.Duration { return 42 * time.Second }
	k.ReadyAfter = func(last *passRes) bool { return last.n > 1 }
	besideRunning, besideDone := make(chan struct{}), make(chan struct{})
	k.Beside = func() []Loop {
		return []Loop{{
			Pass: func(ctx context.Context) error {
				close(besideRunning)
				<-ctx.Done()
				close(besideDone)
				return nil
			},
			Next: func() time.Duration { return time.Hour },
		}}
	}
	finally := make(chan bool, 1)
	k.Finally = func(context.Context) {
		select {
		case <-besideDone:
			finally <- true
		default:
			finally <- false
		}
	}
	if err := k.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ready.MaxPassAge() != 42*time.Second {
		t.Fatalf("MaxPassAge %s, want the service's", ready.MaxPassAge())
	}
	st := <-stops
	<-besideRunning
	if st.OneShot() || st.Requested() {
		t.Fatalf("the loop's stop %+v before Stop", st)
	}
	if err := ready.Check(context.Background(), time.Now()); err != nil {
		t.Fatalf("readiness just after start: %v", err)
	}
	if err := k.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !st.Requested() {
		t.Fatal("Stop did not reach the pass's stop")
	}
	if !<-finally {
		t.Fatal("Finally ran before the loops beside the main loop stopped")
	}
	// The first pass (n=1) is not accepted by ReadyAfter: no pass marked.
	if err := ready.Check(context.Background(), time.Now().Add(time.Minute)); err == nil {
		t.Fatal("a pass ReadyAfter refused marked readiness")
	}
}

// Stop.Context is cancelled when the stop is requested, and not before.
func TestStopContext(t *testing.T) {
	ch := make(chan struct{})
	soft, cancel := Stop{ch: ch}.Context(context.Background())
	defer cancel()
	if soft.Err() != nil {
		t.Fatal("cancelled before the stop")
	}
	close(ch)
	<-soft.Done() // a stop that never cancelled it hangs the test until its timeout
	once, cancelOnce := OneShot.Context(context.Background())
	cancelOnce()
	if once.Err() == nil {
		t.Fatal("a one-shot Stop's context ignores its cancel")
	}
}

// A skeleton missing a required callback is refused by Start and RunOnce,
// naming each one missing, instead of panicking in its first pass.
func TestSkeletonChecksRequiredCallbacks(t *testing.T) {
	k := &Skeleton[*passRes]{Name: "svc", Pass: func(context.Context, Stop) (*passRes, error) { return &passRes{}, nil }}
	err := k.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Next, Summarize") {
		t.Fatalf("Start: %v, want the missing Next and Summarize named", err)
	}
	if _, err := k.RunOnce(context.Background()); err == nil || !strings.Contains(err.Error(), "Summarize") || strings.Contains(err.Error(), "Next") {
		t.Fatalf("RunOnce: %v, want the missing Summarize named (RunOnce needs no Next)", err)
	}
}

// A service that cannot run on a loop in its configuration (the reaper
// without --schedule) refuses Start with CanStart's error, before any
// pass; RunOnce still runs.
func TestSkeletonCanStartRefusesStart(t *testing.T) {
	stops := make(chan Stop, 1)
	k, _ := skeletonFor(t, []error{nil}, stops)
	refusal := errors.New("svc: needs a schedule")
	k.CanStart = func() error { return refusal }
	if err := k.Start(context.Background()); !errors.Is(err, refusal) {
		t.Fatalf("Start = %v, want %v", err, refusal)
	}
	select {
	case <-stops:
		t.Fatal("a refused Start ran a pass")
	default:
	}
	if _, err := k.RunOnce(context.Background()); err != nil {
		t.Fatalf("RunOnce after a refused Start: %v", err)
	}
	if len(stops) != 1 {
		t.Fatalf("RunOnce ran %d passes, want 1", len(stops))
	}
}

// With QuietTimeouts a pass that failed because the database did not
// answer logs at debug in the loop (internal/dbcall logs the fault once)
// and at error when it runs alone.
func TestSkeletonQuietTimeouts(t *testing.T) {
	timeout := fmt.Errorf("svc: %w", &dbcall.TimeoutError{Op: "svc", Bound: time.Second, Err: errors.New("no answer")})
	stops := make(chan Stop, 2)
	k, logs := skeletonFor(t, []error{timeout}, stops)
	k.QuietTimeouts = true
	k.Retry = Retry{Base: time.Hour, Max: time.Hour} // one pass in the loop
	if err := k.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-stops
	if err := k.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := k.RunOnce(context.Background()); !dbcall.IsTimeout(err) {
		t.Fatalf("RunOnce: %v, want the timeout", err)
	}
	<-stops
	var levels []zapcore.Level
	for _, l := range logs.FilterMessage("svc pass").All() {
		levels = append(levels, l.Level)
	}
	if len(levels) != 2 || levels[0] != zapcore.DebugLevel || levels[1] != zapcore.ErrorLevel {
		t.Fatalf("levels %v: want the loop's timeout at debug and the one-shot's at error", levels)
	}
}

// Package startstoptest stresses a service's Start and Stop: several
// goroutines start and stop one service at the same time, over and over, as
// a daemon's shutdown racing its start, or a test's cleanup racing its body,
// would. Run it with -race. It fails the test if a Start or Stop panics,
// returns an error it should not, or hangs, and if any goroutine of the
// service is still running after the final Stop.
package startstoptest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Service is what is stressed.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Options says what Stress may accept from the service.
type Options struct {
	// AlreadyStarted says whether an error from Start only says the
	// service was running already (another goroutine started it first),
	// which the stress provokes on purpose; any other Start error fails
	// the test.
	AlreadyStarted func(error) bool
	// Packages are the import paths whose functions make a goroutine the
	// service's (its own package, the packages that run its loops). After
	// the final Stop none of them may be on the stack of a goroutine that
	// the stress did not find running when it began.
	Packages []string
}

const (
	// Goroutines start and stop the service at the same time.
	Goroutines = 8
	// Rounds is how many times each goroutine starts or stops it.
	Rounds = 40
	// Timeout bounds the whole stress (and the wait for the service's
	// goroutines to end): a deadlock fails the test instead of hanging
	// it. It is generous because CI machines are slow.
	Timeout = 60 * time.Second
)

// Stress starts and stops svc from Goroutines goroutines, Rounds times
// each, with Start's context sometimes cancelled early (which asks the
// service to stop as Stop does), then stops it once more and checks that
// nothing of it runs any more.
func Stress(tb testing.TB, svc Service, opts Options) {
	tb.Helper()
	if opts.AlreadyStarted == nil || len(opts.Packages) == 0 {
		tb.Fatal("startstoptest: Options.AlreadyStarted and Options.Packages are required")
	}
	before := goroutineIDs()

	done := make(chan struct{})
	var (
		mu       sync.Mutex
		problems []string
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for g := range Goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if p := recover(); p != nil {
						report("goroutine %d panicked: %v", g, p)
					}
				}()
				for r := range Rounds {
					switch (g + r) % 4 {
					case 0, 1:
						if err := svc.Start(context.Background()); err != nil && !opts.AlreadyStarted(err) {
							report("Start: %v", err)
						}
					case 2:
						// Start's context ending asks the service to
						// stop, racing the Stops of the others.
						ctx, cancel := context.WithCancel(context.Background())
						if err := svc.Start(ctx); err != nil && !opts.AlreadyStarted(err) {
							report("Start: %v", err)
						}
						cancel()
					case 3:
						if err := svc.Stop(context.Background()); err != nil {
							report("Stop: %v", err)
						}
					}
					runtime.Gosched()
				}
			}()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(Timeout):
		tb.Fatalf("startstoptest: Start and Stop did not all return within %s (a deadlock?)\n%s", Timeout, allStacks())
	}
	for _, p := range problems {
		tb.Error(p)
	}

	if err := finalStop(svc); err != nil {
		tb.Fatalf("startstoptest: final Stop: %v", err)
	}
	// Stop returned, yet a goroutine that has been told to end may take a
	// moment to exit: poll until none is left or the deadline passes.
	deadline := time.Now().Add(leftTimeout)
	for {
		left := serviceGoroutines(before, opts.Packages)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("startstoptest: %d goroutines of the service still run after the final Stop:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// finalStop stops svc once more, within Timeout, turning a panic into an
// error.
func finalStop(svc Service) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	return svc.Stop(ctx)
}

// leftTimeout bounds the wait for the service's goroutines to end after the
// final Stop (shortened by this package's own tests of a leaking service).
var leftTimeout = Timeout

// goroutine is one goroutine of a full stack dump.
type goroutine struct {
	id    string
	stack string
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

func goroutines() []goroutine {
	var gs []goroutine
	for _, block := range strings.Split(allStacks(), "\n\n") {
		// "goroutine 42 [select]:"
		header, _, _ := strings.Cut(block, "\n")
		fields := strings.Fields(header)
		if len(fields) < 2 || fields[0] != "goroutine" {
			continue
		}
		gs = append(gs, goroutine{id: fields[1], stack: block})
	}
	return gs
}

func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for _, g := range goroutines() {
		ids[g.id] = true
	}
	return ids
}

// serviceGoroutines are the stacks of the goroutines not in before that
// run a function of one of packages (a frame "path.Func" or
// "path.(*Type).Method", or one it created: "created by path.").
func serviceGoroutines(before map[string]bool, packages []string) []string {
	var left []string
	for _, g := range goroutines() {
		if before[g.id] {
			continue
		}
		for _, p := range packages {
			if strings.Contains(g.stack, p+".") {
				left = append(left, g.stack)
				break
			}
		}
	}
	return left
}

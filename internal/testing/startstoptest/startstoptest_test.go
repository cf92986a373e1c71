package startstoptest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var errAlreadyStarted = errors.New("already started")

const thisPackage = "github.com/idemd/idemd/internal/testing/startstoptest"

// toyService runs one goroutine between Start and Stop; leak makes its
// Stop forget that goroutine, panicOnStop makes Stop panic.
type toyService struct {
	leak, panicOnStop bool

	mu      sync.Mutex
	running bool
	stop    chan struct{}
	done    chan struct{}
}

func (s *toyService) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return errAlreadyStarted
	}
	s.running, s.stop, s.done = true, make(chan struct{}), make(chan struct{})
	go s.work(s.stop, s.done)
	return nil
}

func (s *toyService) work(stop, done chan struct{}) {
	defer close(done)
	<-stop
}

func (s *toyService) Stop(context.Context) error {
	if s.panicOnStop {
		panic("stop")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	s.running = false
	if !s.leak {
		close(s.stop)
		<-s.done
	}
	return nil
}

func options() Options {
	return Options{
		AlreadyStarted: func(err error) bool { return errors.Is(err, errAlreadyStarted) },
		Packages:       []string{thisPackage},
	}
}

func TestStressPassesACorrectService(t *testing.T) {
	Stress(t, &toyService{}, options())
}

// recordingTB records failures instead of failing the test; its Fatal
// ends the goroutine Stress runs on, as testing's does.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprint(args...))
}
func (r *recordingTB) Fatal(args ...any) { r.Error(args...); runtime.Goexit() }
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.Error(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func stressRecorded(svc Service) []string {
	tb := &recordingTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Stress(tb, svc, options())
	}()
	<-done
	return tb.failures
}

func TestStressFailsOnALeftGoroutine(t *testing.T) {
	leftTimeout = 200 * time.Millisecond
	t.Cleanup(func() { leftTimeout = Timeout })
	svc := &toyService{leak: true}
	failures := stressRecorded(svc)
	if len(failures) != 1 || !strings.Contains(failures[0], "still run after the final Stop") || !strings.Contains(failures[0], "toyService).work") {
		t.Fatalf("a service whose Stop leaves its goroutine running: failures %q, want one naming the goroutine", failures)
	}
	close(svc.stop) // end the last leaked goroutine; the others stay parked
}

func TestStressFailsOnAPanic(t *testing.T) {
	failures := stressRecorded(&toyService{panicOnStop: true})
	if len(failures) == 0 || !strings.Contains(failures[0], "panicked: stop") {
		t.Fatalf("a service whose Stop panics: failures %q, want a panic reported", failures)
	}
}

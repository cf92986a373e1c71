package testsignal

import (
	"fmt"
	"strings"
	"testing"
)

func TestUninitialisedSignalDropsValues(t *testing.T) {
	var s Signal[int]
	for i := 0; i < 2*Capacity; i++ {
		s.Signal(i) // must neither block nor panic
	}
	if s.ch != nil {
		t.Fatal("Signal initialised itself")
	}
}

func TestSignalDeliversInOrder(t *testing.T) {
	var s Signal[string]
	s.Init(t)
	s.Signal("a")
	s.Signal("b")
	if a, b := s.WaitOrTimeout(t), s.WaitOrTimeout(t); a != "a" || b != "b" {
		t.Fatalf("got %q, %q", a, b)
	}
}

// recordingTB is a testing.TB whose cleanups and failures the test runs
// and reads itself, so a failure it expects does not fail the test.
type recordingTB struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Cleanup(f func())          { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Errorf(f string, a ...any) { r.errors = append(r.errors, fmt.Sprintf(f, a...)) }

func (r *recordingTB) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestOverflowFailsTheTest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		signals int
		read    int
		dropped int
	}{
		{"at capacity", Capacity, 0, 0},
		{"past capacity", Capacity + 3, 0, 3},
		{"read in time", Capacity + 3, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			var s Signal[int]
			s.Init(tb)
			for i := 0; i < tc.signals; i++ {
				if i == Capacity {
					for j := 0; j < tc.read; j++ {
						if got := s.WaitOrTimeout(t); got != j {
							t.Fatalf("read %d, want %d", got, j)
						}
					}
				}
				s.Signal(i)
			}
			tb.end()
			if tc.dropped == 0 {
				if len(tb.errors) != 0 {
					t.Fatalf("no value was dropped, yet the test failed: %q", tb.errors)
				}
				return
			}
			if len(tb.errors) != 1 || !strings.Contains(tb.errors[0], fmt.Sprintf("%d values dropped", tc.dropped)) {
				t.Fatalf("%d values dropped: failures %q, want one saying so", tc.dropped, tb.errors)
			}
		})
	}
}

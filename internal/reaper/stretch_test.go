package reaper

import (
	"testing"
	"time"

	"github.com/idemd/idemd/internal/reaper/throttle"
)

// A stretch starts once however many waits it holds, counts the rounds and
// WAL inside it, and ends once with its totals.
func TestStretchTotals(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	var s stretch
	s.round(1 << 20) // outside a stretch: not counted
	if _, ok := s.end(t0); ok {
		t.Fatal("ended a stretch that never started")
	}
	starts := 0
	for i := range 5 {
		if s.start(t0.Add(time.Duration(i)*500*time.Millisecond), throttle.ReasonWALRate) {
			starts++
		}
		if s.quiet(t0.Add(time.Duration(i) * 500 * time.Millisecond)) {
			t.Fatalf("quiet %d s into a stretch that waited every second", i)
		}
		s.waited(t0.Add(time.Duration(i)*500*time.Millisecond), throttle.ReasonWALRate, 700*time.Millisecond)
		s.round(2 << 20)
	}
	if s.start(t0, throttle.ReasonReplicaLag) {
		starts++
	}
	if s.first(throttle.ReasonWALRate) || !s.first(throttle.ReasonReplicaLag) {
		t.Fatal("first: want the reason not yet waited for only")
	}
	s.waited(t0.Add(2*time.Second), throttle.ReasonReplicaLag, 300*time.Millisecond)
	if starts != 1 {
		t.Fatalf("%d starts, want 1", starts)
	}
	if s.quiet(t0.Add(2*time.Second+stretchQuiet-1)) || !s.quiet(t0.Add(2*time.Second+stretchQuiet)) {
		t.Fatalf("quiet: want %s after the last wait", stretchQuiet)
	}
	done, ok := s.end(t0.Add(6 * time.Second))
	if !ok || done.reason != throttle.ReasonWALRate || done.rounds != 5 || done.bytes != 10<<20 ||
		done.waitedTotal != 3800*time.Millisecond || done.lasted != 6*time.Second ||
		done.by[throttle.ReasonReplicaLag] != 300*time.Millisecond || len(done.reasons()) != 2 {
		t.Fatalf("stretch %+v", done)
	}
	if _, ok := s.end(t0); ok {
		t.Fatal("ended twice")
	}
}

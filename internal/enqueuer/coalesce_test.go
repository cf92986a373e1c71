package enqueuer

import (
	"context"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/lifecycle"
)

// Under a stream of commits a pass waits until window after the previous
// one, so it moves the rows of several notifications; an isolated commit,
// a pass behind a backlog and the first pass go at once.
func TestCoalesceDelay(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	end := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name      string
		window    time.Duration
		lastTaken int
		lastEnd   time.Time
		now       time.Time
		want      time.Duration
	}{
		{"off", 0, 1, end, end, 0},
		{"first pass", ms(3), 0, time.Time{}, end, 0},
		{"isolated commit: previous pass long ago", ms(3), 1, end, end.Add(time.Second), 0},
		{"previous pass exactly a window ago", ms(3), 1, end, end.Add(ms(3)), 0},
		{"stream: woken right after a pass", ms(3), 1, end, end, ms(3)},
		{"stream: woken 1 ms after a pass", ms(3), 2, end, end.Add(ms(1)), ms(2)},
		{"stream: an empty pass (the other replica took the rows)", ms(3), 0, end, end.Add(ms(0.5)), ms(2.5)},
		{"backlog: the previous pass took many rows", ms(3), coalesceRows, end, end, 0},
		{"backlog: a full batch", ms(3), 5000, end, end.Add(ms(1)), 0},
		{"just under the row threshold", ms(3), coalesceRows - 1, end, end, ms(3)},
		{"clock went back", ms(3), 1, end, end.Add(-ms(5)), ms(3)},
	} {
		if got := coalesceDelay(c.window, c.lastTaken, c.lastEnd, c.now, 1000); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
		if got := coalesceDelay(c.window, c.lastTaken, c.lastEnd, c.now, 1000); got < 0 || got > c.window {
			t.Errorf("%s: %s outside [0, window]", c.name, got)
		}
		// Below coalesceMinRate notifications a second, never a wait.
		if got := coalesceDelay(c.window, c.lastTaken, c.lastEnd, c.now, coalesceMinRate-1); got != 0 {
			t.Errorf("%s at a low rate: %s, want 0", c.name, got)
		}
	}
}

func TestWakeCoalesceIsChecked(t *testing.T) {
	for _, c := range []struct {
		d  time.Duration
		ok bool
	}{{0, true}, {3 * time.Millisecond, true}, {time.Second, true}, {-time.Millisecond, false}, {2 * time.Second, false}} {
		s := DefaultSettings()
		s.WakeCoalesce = c.d
		if p := s.Check(); (len(p) == 0) != c.ok {
			t.Errorf("--wake-coalesce %s: %v", c.d, p)
		}
	}
}

// The floor counts the notifications since the last drain took it.
func TestFloorCountsPendingNotifications(t *testing.T) {
	f := newFloor()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		f.notify(int64(10-i), now)
	}
	f.lowerSwept(5, true)
	f.lower(fullPass) // a full-pass request is not a notification
	if n := f.pending(); n != 3 {
		t.Fatalf("pending %d, want 3", n)
	}
	if _, ok := f.take(0); !ok {
		t.Fatal("no drain")
	}
	if n := f.pending(); n != 0 {
		t.Fatalf("pending %d after the drain took the floor", n)
	}
}

// decayedRate is the mean rate of a steady stream and forgets a burst
// within about a second.
func TestDecayedRate(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	stream := func(perSecond int, d time.Duration) (float64, time.Time) {
		r, last := 0.0, time.Time{}
		step := time.Second / time.Duration(perSecond)
		for at := t0; at.Before(t0.Add(d)); at = at.Add(step) {
			r, last = decayedRate(r, last, at, 1), at
		}
		return r, last
	}
	for _, c := range []struct {
		perSecond int
		lo, hi    float64
	}{{20, 17, 23}, {60, 54, 66}, {150, 140, 165}, {1000, 950, 1050}} {
		if r, _ := stream(c.perSecond, 3*time.Second); r < c.lo || r > c.hi {
			t.Errorf("%d a second: rate %.1f, want %v-%v", c.perSecond, r, c.lo, c.hi)
		}
	}
	r, last := stream(150, 3*time.Second)
	if q := decayedRate(r, last, last.Add(time.Second), 0); q >= coalesceMinRate/4 {
		t.Errorf("a second after a 150/s stream: %.1f a second", q)
	}
	if r, _ := stream(40, 3*time.Second); r >= coalesceMinRate {
		t.Errorf("40 a second counts as %.1f, at or above coalesceMinRate", r)
	}
}

// A woken pass under a stream waits no longer than it takes
// coalesceNotifications to arrive: with the window an hour long it
// returns once they did.
func TestCoalesceReturnsOnceEnoughNotificationsArrive(t *testing.T) {
	s := &Service{cfg: Config{Settings: Settings{WakeCoalesce: time.Hour}}, floor: newFloor(), wake: make(chan struct{}, 1)}
	now := time.Now()
	for range 100 {
		s.floor.notify(1, now) // a stream: the rate is far above coalesceMinRate
	}
	if _, ok := s.floor.take(0); !ok {
		t.Fatal("no drain")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.coalesce(context.Background(), lifecycle.Stop{}, 1, time.Now())
	}()
	for i := range coalesceNotifications {
		s.floor.notify(int64(i), time.Now())
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("coalesce still waits after enough notifications")
	}
}

// A pass ends after a drain that took few rows (the next one waits for
// company in coalesce), goes on behind a backlog, and with coalescing off
// drains whatever the floor asks for.
func TestEndPass(t *testing.T) {
	for _, c := range []struct {
		window time.Duration
		taken  int
		want   bool
	}{
		{50 * time.Millisecond, 0, true},
		{50 * time.Millisecond, 2, true},
		{50 * time.Millisecond, coalesceRows - 1, true},
		{50 * time.Millisecond, coalesceRows, false},
		{50 * time.Millisecond, 5000, false},
		{0, 1, false},
	} {
		if got := endPass(c.window, c.taken); got != c.want {
			t.Errorf("window %s, %d rows: %v, want %v", c.window, c.taken, got, c.want)
		}
	}
}

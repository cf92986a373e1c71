package enqueuer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/dbtest"
	"github.com/idemd/idemd/internal/testwait"
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
		if got := coalesceDelay(c.window, c.lastTaken, c.lastEnd, c.now); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
		if got := coalesceDelay(c.window, c.lastTaken, c.lastEnd, c.now); got < 0 || got > c.window {
			t.Errorf("%s: %s outside [0, window]", c.name, got)
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
	for i := range 3 {
		f.notify(int64(10 - i))
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

// A woken pass waits no longer than it takes coalesceNotifications to
// arrive: with the window an hour long, rows staged in that many commits
// still move.
func TestCoalesceStartsOnceEnoughNotificationsArrive(t *testing.T) {
	pool := dbtest.NewPool(t)
	s := newService(t, pool, func(st *Settings) { st.PollInterval = time.Hour })
	s.cfg.WakeCoalesce = time.Hour // past the flag's bound: only the count can end the wait
	s.signals.listenerUp.Init()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background()) //nolint:errcheck
	s.signals.listenerUp.WaitOrTimeout(t)
	stageEach(t, pool, coalesceNotifications)
	testwait.Until(t, time.Minute, "the rows of enough notifications to move", func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job") == coalesceNotifications
	})
	if testutil.ToFloat64(s.metrics.wakeups.WithLabelValues(wakePoll)) != 0 {
		t.Fatal("a poll happened with an hour-long interval")
	}
}

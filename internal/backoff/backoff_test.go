package backoff

import (
	"testing"
	"time"
)

func TestCeilingDoublesUpToMax(t *testing.T) {
	for _, c := range []struct {
		attempt int
		want    time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 10 * time.Second}, {500, 10 * time.Second}} {
		if got := Ceiling(c.attempt, time.Second, 10*time.Second); got != c.want {
			t.Errorf("Ceiling(%d) = %s, want %s", c.attempt, got, c.want)
		}
	}
}

// Delay hands the ceiling to jitter and returns what it chose.
func TestDelayIsJitterBelowTheCeiling(t *testing.T) {
	var asked int64
	got := Delay(3, time.Second, time.Minute, func(n int64) int64 { asked = n; return n - 1 })
	if asked != int64(4*time.Second) || got != 4*time.Second-1 {
		t.Fatalf("jitter asked for %d, Delay = %s", asked, got)
	}
	for range 1000 {
		if d := Delay(2, time.Second, time.Minute, nil); d < 0 || d >= 2*time.Second {
			t.Fatalf("Delay(2) = %s, outside [0, 2s)", d)
		}
	}
	if d := Delay(1, 0, time.Minute, nil); d != 0 {
		t.Fatalf("zero base: Delay = %s", d)
	}
}

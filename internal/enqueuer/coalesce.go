package enqueuer

import (
	"context"
	"math"
	"time"

	"github.com/idemd/idemd/internal/lifecycle"
)

// coalesceRows: a pass that took at least this many rows ran behind a
// backlog, and the next one starts at once, never waiting out a window.
const coalesceRows = 16

// coalesceNotifications: a waiting pass starts as soon as this many
// notifications (each a committed statement's rows) arrived since the
// previous pass took the floor. So the window bounds the wait when commits
// are few, and at a high rate a pass starts once it has a few rows to
// move, long before the window ends (at 1,000 commits a second, after
// about 4 ms).
const coalesceNotifications = 4

// coalesceMinRate: below this many notifications a second every commit is
// moved at once. A pass per commit then costs at most this many
// transactions a second, and waiting would only add latency; above it,
// passes would compete with the API for the machine, so they
// wait for company.
const coalesceMinRate = 50.0

// rateHalfLife is how fast the notification rate forgets: a burst
// raises it within a few commits, and a quiet spell brings an isolated
// commit back to being moved at once within about a second.
const rateHalfLife = 250 * time.Millisecond

// decayedRate is an exponentially decayed event rate (events a second,
// remembering with rateHalfLife): the rate r measured at last, decayed to
// now, plus n events at now. It is the mean rate of a steady stream and
// follows a change of rate within a few half-lives.
func decayedRate(r float64, last, now time.Time, n float64) float64 {
	tau := rateHalfLife.Seconds() / math.Ln2
	if !last.IsZero() {
		dt := now.Sub(last).Seconds()
		if dt > 0 {
			r *= math.Exp(-dt / tau)
		}
	}
	return r + n/tau
}

// maxWakeCoalesce bounds --wake-coalesce.
const maxWakeCoalesce = time.Second

// coalesceDelay is the longest the loop waits, once woken, before the pass
// it was woken for, so that under a stream of commits each pass moves the
// rows of several notifications instead of one (each pass is a
// transaction; at a few hundred commits a second a pass per commit takes
// the API's CPU). It waits only while notifications arrive at
// coalesceMinRate or more (rate, decayedRate's), so at an API's everyday
// rates a commit is moved at once. The window runs from the end of the
// previous pass: the next pass starts no sooner than window after it (or
// once coalesceNotifications have arrived), and only when that pass took
// fewer than coalesceRows rows. A pass behind a backlog is followed at
// once; the added latency is at most the window. window 0 turns
// coalescing off.
func coalesceDelay(window time.Duration, lastTaken int, lastEnd, now time.Time, rate float64) time.Duration {
	if window <= 0 || lastEnd.IsZero() || lastTaken >= coalesceRows || rate < coalesceMinRate {
		return 0
	}
	since := now.Sub(lastEnd)
	if since < 0 {
		since = 0
	}
	if since >= window {
		return 0
	}
	return window - since
}

// coalesce waits out coalesceDelay before a pass, or until
// coalesceNotifications are pending; it returns early when stop is closed
// or ctx ends (the pass then sees them).
func (s *Service) coalesce(ctx context.Context, stop lifecycle.Stop, lastTaken int, lastEnd time.Time) {
	now := time.Now()
	d := coalesceDelay(s.cfg.WakeCoalesce, lastTaken, lastEnd, now, s.floor.rate(now))
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
wait:
	for s.floor.pending() < coalesceNotifications {
		select {
		case <-t.C:
			break wait
		case <-stop.Done():
			break wait
		case <-ctx.Done():
			break wait
		case <-s.wake:
			// Another notification: count again.
		}
	}
	// The wake-ups that arrived meanwhile are this pass's: the floor they
	// lowered is taken below. Left pending, each would start a pass that
	// finds the floor already taken.
	select {
	case <-s.wake:
	default:
	}
}

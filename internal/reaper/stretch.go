package reaper

import (
	"slices"
	"time"

	"github.com/idemd/idemd/internal/reaper/throttle"
)

// stretch is a throttled stretch of a run: from the first wait to the
// first round that needed none after stretchQuiet without a wait, or the
// run's end. The log has one line at its start and one at its end with
// its totals, whatever it waited for in between: a paced run waits after
// nearly every round, and a line per wait would be a line per batch. Pure:
// the caller passes the time.
type stretch struct {
	active bool
	// last is when its latest wait ended.
	last time.Time
	// reason is the first wait's.
	reason      throttle.Reason
	since       time.Time
	waitedTotal time.Duration
	by          map[throttle.Reason]time.Duration
	// rounds ran, and the WAL they wrote, inside the stretch.
	rounds int
	bytes  int64
	lasted time.Duration
}

// start records a wait for reason at now, and reports whether it starts a
// stretch (the caller logs it).
func (s *stretch) start(now time.Time, reason throttle.Reason) bool {
	if s.active {
		return false
	}
	*s = stretch{active: true, reason: reason, since: now, last: now, by: map[throttle.Reason]time.Duration{}}
	return true
}

// stretchQuiet is how long a run goes without waiting before its stretch
// ends: a paced round that happened to need no wait (it took as long as
// its WAL takes at the rate) does not end one.
const stretchQuiet = time.Second

// first reports whether the stretch in progress has not yet waited for
// reason.
func (s *stretch) first(reason throttle.Reason) bool {
	_, seen := s.by[reason]
	return s.active && !seen
}

// waited adds a wait that ended at now to the stretch.
func (s *stretch) waited(now time.Time, reason throttle.Reason, d time.Duration) {
	if !s.active {
		return
	}
	s.last = now
	s.waitedTotal += d
	s.by[reason] += d
}

// round adds a round that ran inside the stretch and the WAL it wrote.
func (s *stretch) round(bytes int64) {
	if !s.active {
		return
	}
	s.rounds++
	s.bytes += bytes
}

// quiet reports whether a stretch is in progress and its latest wait
// ended stretchQuiet or more before now: a round that needs no wait then
// ends it.
func (s *stretch) quiet(now time.Time) bool {
	return s.active && now.Sub(s.last) >= stretchQuiet
}

// end closes the stretch at now and returns it; false when none was in
// progress.
func (s *stretch) end(now time.Time) (stretch, bool) {
	if !s.active {
		return stretch{}, false
	}
	done := *s
	done.lasted = now.Sub(s.since)
	*s = stretch{}
	return done, true
}

// reasons are the reasons the stretch waited for, in a stable order.
func (s stretch) reasons() []throttle.Reason {
	var rs []throttle.Reason
	for r := range s.by {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

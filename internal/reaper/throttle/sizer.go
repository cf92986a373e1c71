package throttle

import (
	"slices"
	"time"
)

// MinBatch is the smallest batch the sizer shrinks to: below a few
// hundred keys a batch's fixed cost (its round trips, its commit) is most
// of its time, and the API's commits wait for its flush no less.
const MinBatch = 500

// Sizer moves the batch size on the commit probe's latency while the
// reaper's rounds run, additive increase and multiplicative decrease as
// TCP does its window. The API's commits queue behind each batch's WAL
// flush, so the batch size is what bounds their wait; a pause between
// batches only spaces the waits out.
//
// It reacts to the round's slowest probe (RoundProbes.Worst), not its
// median: a budget is a bound on what the API's commits wait, and a round
// whose median keeps it can still hold a tenth of them several times over
// it, which is the inserts' p99. A round over the budget shrinks the next
// batch by the overshoot (budget/worst, at least halving, at most to an
// eighth); a round well under it (worst at most half the budget) adds a
// step; a round in between holds the size, so it settles just under the
// budget instead of swinging across it. Pure; not safe for concurrent use.
type Sizer struct {
	min, max, step int
	size           int
}

// NewSizer returns a sizer between lo and hi keys (hi: --batch-size; lo is
// lowered to hi when hi is smaller) starting at start.
func NewSizer(lo, hi, start int) *Sizer {
	lo = min(lo, hi)
	// A twentieth of the range per round: from the floor to a default
	// 30,000-key batch in twenty rounds, a few seconds of a run.
	step := max((hi-lo)/20, 1)
	return &Sizer{min: lo, max: hi, step: step, size: min(max(start, lo), hi)}
}

// Size is the next batch's size.
func (s *Sizer) Size() int { return s.size }

// AtMin reports whether the sizer cannot shrink the batch further.
func (s *Sizer) AtMin() bool { return s.size <= s.min }

// Decrease bounds: a round over the budget at least halves the next batch
// (a small overshoot is still the API waiting past the budget) and at most
// cuts it to an eighth (one stall of the machine, not of the reaper, must
// not throw away twenty rounds of growth).
const (
	mostKept  = 0.5
	leastKept = 0.125
)

// Observe moves the size on a round's slowest probe commit against the
// budget; a round without a measurement (0) leaves it.
func (s *Sizer) Observe(r RoundProbes, budget time.Duration) {
	worst := r.Worst
	switch {
	case worst == 0 || budget == 0:
	case worst > budget:
		kept := min(max(float64(budget)/float64(worst), leastKept), mostKept)
		s.size = max(int(float64(s.size)*kept), s.min)
	case worst <= budget/2:
		s.size = min(s.size+s.step, s.max)
	}
}

// Cap lowers the ceiling for the next batch only: the WAL pacer's share
// of keys. It returns the batch size within [min, cap].
func (s *Sizer) Cap(keys int) int {
	return min(s.size, max(keys, s.min))
}

// RoundProbes is what the commit probes measured while a round of batches
// ran and just after it (Reader.ProbeRound): the median and slowest
// commit, and how many probes finished. The zero value is no measurement.
type RoundProbes struct {
	Median, Worst time.Duration
	N             int
}

// SummarizeProbes is the median and slowest of a round's probe commits.
func SummarizeProbes(ds []time.Duration) RoundProbes {
	if len(ds) == 0 {
		return RoundProbes{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return RoundProbes{Median: s[len(s)/2], Worst: s[len(s)-1], N: len(s)}
}

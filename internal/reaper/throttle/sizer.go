package throttle

import "time"

// MinBatch is the smallest batch the sizer shrinks to: below a few
// hundred keys a batch's fixed cost (its round trips, its commit) is most
// of its time, and the API's commits wait for its flush no less.
const MinBatch = 500

// Sizer moves the batch size on the commit probe's latency while the
// reaper's rounds run, additive increase and multiplicative decrease as
// TCP does its window: a round whose probes' median commit was over the
// budget halves the next batch, a round under it adds a step. The API's
// commits queue behind each batch's WAL flush, so the batch size is what
// bounds their wait; a pause between batches only spaces the waits out.
// It settles where the rounds just keep the budget. Pure; not safe for
// concurrent use.
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

// Observe moves the size on a round's median probe commit against the
// budget; a round without a measurement (0) leaves it.
func (s *Sizer) Observe(roundCommit, budget time.Duration) {
	switch {
	case roundCommit == 0 || budget == 0:
	case roundCommit > budget:
		s.size = max(s.size/2, s.min)
	default:
		s.size = min(s.size+s.step, s.max)
	}
}

// Cap lowers the ceiling for the next batch only: the WAL pacer's share
// of keys. It returns the batch size within [min, cap].
func (s *Sizer) Cap(keys int) int {
	return min(s.size, max(keys, s.min))
}

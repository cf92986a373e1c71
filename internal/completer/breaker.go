package completer

import (
	"sync"
	"time"
)

// BreakerState is the circuit breaker's state, exported as the
// idemd_completer_breaker_state gauge (0 closed, 1 half-open, 2 open).
type BreakerState int

const (
	BreakerClosed   BreakerState = 0
	BreakerHalfOpen BreakerState = 1
	BreakerOpen     BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// breaker is a small purpose-built circuit breaker. It is not
// github.com/sony/gobreaker because the completer needs two things that one
// does not offer: an injectable clock (tests drive the open → half-open
// transition without sleeping) and a cool-down that doubles on every failed
// probe up to a cap, so an API that stays down sees one probe per
// (growing) interval, never a stampede.
//
// Closed: every request passes; threshold consecutive failures open it.
// Open: nothing passes until the cool-down has elapsed; then half-open.
// Half-open: exactly one probe passes; its success closes the breaker (and
// resets the cool-down), its failure re-opens it with a doubled cool-down.
type breaker struct {
	now         func() time.Time
	threshold   int
	baseCool    time.Duration
	maxCool     time.Duration
	onChange    func(from, to BreakerState)
	mu          sync.Mutex
	state       BreakerState
	consecutive int
	cool        time.Duration
	openUntil   time.Time
	probing     bool
}

func newBreaker(now func() time.Time, threshold int, cool, maxCool time.Duration, onChange func(from, to BreakerState)) *breaker {
	if maxCool < cool {
		maxCool = cool
	}
	return &breaker{now: now, threshold: threshold, baseCool: cool, maxCool: maxCool, cool: cool, onChange: onChange}
}

// State returns the current state, moving open to half-open when the
// cool-down has elapsed.
func (b *breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked()
	return b.state
}

// Remaining is how long the breaker stays open (0 when not open).
func (b *breaker) Remaining() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked()
	if b.state != BreakerOpen {
		return 0
	}
	return b.openUntil.Sub(b.now())
}

// Allow reports whether a request may be sent. Every true must be followed
// by exactly one Done or Cancel.
func (b *breaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		if b.probing {
			return false
		}
		b.probing = true
		return true
	default:
		return false
	}
}

// Done records the result of an allowed request.
func (b *breaker) Done(failed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		if !failed {
			b.consecutive = 0
			return
		}
		b.consecutive++
		if b.consecutive >= b.threshold {
			b.openLocked()
		}
	case BreakerHalfOpen:
		b.probing = false
		if failed {
			b.cool *= 2
			if b.cool > b.maxCool {
				b.cool = b.maxCool
			}
			b.openLocked()
			return
		}
		b.cool = b.baseCool
		b.consecutive = 0
		b.setLocked(BreakerClosed)
	default:
		// A request allowed while closed that completes after the breaker
		// opened: its result is already reflected, ignore it.
	}
}

// Cancel returns an allowed request that was never sent (shutdown, no
// lease time left): it counts neither way.
func (b *breaker) Cancel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerHalfOpen {
		b.probing = false
	}
}

func (b *breaker) openLocked() {
	b.openUntil = b.now().Add(b.cool)
	b.consecutive = 0
	b.setLocked(BreakerOpen)
}

func (b *breaker) advanceLocked() {
	if b.state == BreakerOpen && !b.now().Before(b.openUntil) {
		b.probing = false
		b.setLocked(BreakerHalfOpen)
	}
}

func (b *breaker) setLocked(s BreakerState) {
	if s == b.state {
		return
	}
	from := b.state
	b.state = s
	if b.onChange != nil {
		b.onChange(from, s)
	}
}

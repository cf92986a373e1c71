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
//
// Only failures that say something about the API count (classifyFailure):
// a key the API has already failed while it answered other keys is failing
// on its own (a data-dependent bug), and its further failures neither open
// the breaker, nor re-open it as a probe, nor break a success streak. That
// key still backs off and is given up on its own schedule (Service.fail).
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

	// successes counts requests the API answered (any key). failedAt maps
	// a key that failed to the value of successes at its last failure: if
	// successes has grown since, the API answered other keys after this
	// key failed. Entries go when the key succeeds, is given up or is gone
	// (Forget), so the map is bounded by the keys currently failing.
	successes uint64
	failedAt  map[int64]uint64
}

// failureKind is what one failed request says.
type failureKind int

const (
	// apiFailure: evidence that the API is down; it counts towards
	// opening the breaker.
	apiFailure failureKind = iota
	// keyFailure: this key fails while the API answers others; it counts
	// neither way.
	keyFailure
)

func (k failureKind) String() string {
	if k == keyFailure {
		return "key"
	}
	return "api"
}

// classifyFailure decides what a failure of one key says, by comparing it
// with the outcomes of other keys rather than reading the reply: a single
// 500 looks the same whether the API is down or this key hits a bug.
//
// A key that has failed before (failedBefore) and since whose failure the
// API has answered other keys (successes > failEpoch) is failing on its
// own: keyFailure. A first failure, or a repeat failure with no success
// anywhere in between (an outage that simply lasts), is apiFailure.
func classifyFailure(failedBefore bool, failEpoch, successes uint64) failureKind {
	if failedBefore && successes > failEpoch {
		return keyFailure
	}
	return apiFailure
}

func newBreaker(now func() time.Time, threshold int, cool, maxCool time.Duration, onChange func(from, to BreakerState)) *breaker {
	if maxCool < cool {
		maxCool = cool
	}
	return &breaker{now: now, threshold: threshold, baseCool: cool, maxCool: maxCool, cool: cool, onChange: onChange, failedAt: map[int64]uint64{}}
}

// lastFailureLocked reports whether key id has failed before and the value
// of successes then. attempts is the key's completer_attempts as claimed:
// a key that failed before this process started (attempts > 0, not in
// failedAt) is taken to have failed before any success this process saw.
func (b *breaker) lastFailureLocked(id int64, attempts int) (bool, uint64) {
	if e, ok := b.failedAt[id]; ok {
		return true, e
	}
	return attempts > 0, 0
}

// Suspect reports whether a failure of key id now would be a keyFailure:
// the key failed before and the API has answered other keys since. Such a
// key can tell nothing about the API and must not be a probe.
func (b *breaker) Suspect(id int64, attempts int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	before, e := b.lastFailureLocked(id, attempts)
	return classifyFailure(before, e, b.successes) == keyFailure
}

// Succeeded records that the API answered key id's allowed request.
func (b *breaker) Succeeded(id int64) {
	b.mu.Lock()
	b.successes++
	delete(b.failedAt, id)
	b.mu.Unlock()
	b.Done(false)
}

// Failed records that key id's allowed request failed (attempts is its
// completer_attempts before this one) and returns what the failure was
// taken for. A keyFailure counts neither way: as a probe it releases the
// half-open slot so the next probe can be a key that tells us something.
func (b *breaker) Failed(id int64, attempts int) failureKind {
	b.mu.Lock()
	before, e := b.lastFailureLocked(id, attempts)
	kind := classifyFailure(before, e, b.successes)
	if kind == apiFailure {
		// A keyFailure keeps its older mark: a key once seen failing on its
		// own stays suspect until it succeeds, or a streak with no success
		// in between would make it look like evidence again.
		b.failedAt[id] = b.successes
	}
	b.mu.Unlock()
	if kind == keyFailure {
		b.Cancel()
		return kind
	}
	b.Done(true)
	return kind
}

// Forget drops what the breaker remembers of key id (given up or gone).
func (b *breaker) Forget(id int64) {
	b.mu.Lock()
	delete(b.failedAt, id)
	b.mu.Unlock()
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

package completer

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Adaptive concurrency. An API whose phases run SERIALIZABLE (the
// article's) makes concurrent replays conflict with each other: they fail
// with serialization failures, answered 409, and each one is an attempt
// lost and a replay more. How many replays at once an API takes without
// that is a property of the API, not something an operator should have
// to find by trial, so the completer finds it: the number of replays in
// flight is limited by an additive-increase/multiplicative-decrease
// controller (aimd) between 1 and --concurrency. A conflict halves the
// limit; every replay started since that meets none raises it by 1/limit,
// so by one per limit's worth of clear replays. An API that never
// conflicts keeps the limit at --concurrency.
//
// aimd is pure: it is told of every replay's start and end (with the time,
// for the length of a backoff episode) and returns what changed; the gate
// below does the blocking, process (replay.go) the telling, and
// concurrencyChanged (completer.go) the logging and the gauge.

// congestion is what one replay says about the API's contention.
type congestion int

const (
	congestionNone     congestion = iota // no answer, or one that tells nothing (a live request's 409)
	congestionClear                      // answered without a conflict
	congestionConflict                   // a 409 on a key no request holds: the API's transaction conflicted
)

func (c congestion) String() string {
	return [...]string{"none", "clear", "conflict"}[c]
}

// congestionOf is what a replay's reply and the re-read row say about
// contention. A 409 on a key the API does not hold is a conflict: with
// the article's API, a serialization failure (or a parameter mismatch,
// which the row cannot tell apart: it is one key's, retried rarely after
// backoff, and the limit climbs back between its attempts). A 409 on a
// held key is a live request's: no sign of the completer's own load.
func congestionOf(rep reply, st keyState) congestion {
	switch {
	case rep.err != nil:
		return congestionNone
	case rep.status == http.StatusConflict && st.locked:
		return congestionNone
	case rep.status == http.StatusConflict && st.exists && !st.finished:
		return congestionConflict
	}
	return congestionClear
}

// ticket numbers a replay in the order replays start: a conflict met by
// a replay that started before the last decrease was caused by the load
// the decrease already answered, and decreases nothing again (one
// decrease per round of replays, as TCP's congestion window halves once
// per window); a clear one ran under the old limit and raises nothing
// either.
type ticket uint64

// limitChange is what one report did to the limit.
type limitChange struct {
	from, to int
	// backedOff: the limit went down from --concurrency, starting a
	// backoff episode (logged once per episode, not per conflict).
	backedOff bool
	// recovered: the limit is back at --concurrency, ending the episode,
	// which lasted episode.
	recovered bool
	episode   time.Duration
}

func (c limitChange) changed() bool { return c.from != c.to }

// aimd is the adaptive limit on replays in flight.
type aimd struct {
	max      int
	limit    float64
	adaptive bool // false: the limit stays at max (a test's fixed baseline)
	issued   ticket
	cutAt    ticket    // tickets up to this one started before the last decrease
	since    time.Time // start of the backoff episode; zero outside one
}

// newAIMD starts at ceiling (--concurrency): an API that never conflicts
// is never held back.
func newAIMD(ceiling int, adaptive bool) *aimd {
	return &aimd{max: ceiling, limit: float64(ceiling), adaptive: adaptive}
}

// current is the limit on replays in flight.
func (a *aimd) current() int { return int(a.limit) }

// start issues the ticket of a replay that starts now.
func (a *aimd) start() ticket {
	a.issued++
	return a.issued
}

// done is told that the replay of ticket t ended at now with c.
func (a *aimd) done(t ticket, c congestion, now time.Time) limitChange {
	ch := limitChange{from: a.current()}
	if a.adaptive {
		switch c {
		case congestionConflict:
			if t > a.cutAt {
				a.limit = max(1, float64(int(a.limit/2)))
				a.cutAt = a.issued
				if a.since.IsZero() && a.current() < a.max {
					a.since = now
					ch.backedOff = true
				}
			}
		case congestionClear:
			if t <= a.cutAt {
				// It ran under the limit before the decrease: it says
				// nothing about the new one.
				break
			}
			a.limit = min(float64(a.max), a.limit+1/a.limit)
			if !a.since.IsZero() && a.current() == a.max {
				ch.recovered, ch.episode = true, now.Sub(a.since)
				a.since = time.Time{}
			}
		}
	}
	ch.to = a.current()
	return ch
}

// gate holds replays back while as many as the limit are in flight.
type gate struct {
	mu       sync.Mutex
	ctl      *aimd
	inFlight int
	freed    chan struct{} // closed (and replaced) when a slot frees or the limit rises
}

func newGate(ctl *aimd) *gate {
	return &gate{ctl: ctl, freed: make(chan struct{})}
}

// acquire waits for a slot and returns the replay's ticket. When ctx ends
// it takes one at once: the replay then sends nothing (process defers the
// key), and release stays balanced.
func (g *gate) acquire(ctx context.Context) ticket {
	for {
		g.mu.Lock()
		if g.inFlight < g.ctl.current() || ctx.Err() != nil {
			g.inFlight++
			t := g.ctl.start()
			g.mu.Unlock()
			return t
		}
		freed := g.freed
		g.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
		}
	}
}

// release frees t's slot, reports c and returns what it did to the limit.
func (g *gate) release(t ticket, c congestion, now time.Time) limitChange {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	ch := g.ctl.done(t, c, now)
	close(g.freed)
	g.freed = make(chan struct{})
	return ch
}

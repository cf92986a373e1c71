package completer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// What a replay says about the API's contention: only a 409 on a key no
// request holds is a conflict.
func TestCongestionOf(t *testing.T) {
	unfinished := keyState{exists: true, leaseOurs: true, recoveryPoint: "started"}
	held := unfinished
	held.locked = true
	finished := keyState{exists: true, finished: true, leaseOurs: true, recoveryPoint: "finished"}
	for _, c := range []struct {
		name string
		rep  reply
		st   keyState
		want congestion
	}{
		{"409 on a key no request holds", reply{status: 409}, unfinished, congestionConflict},
		{"409 on a key a live request holds", reply{status: 409}, held, congestionNone},
		{"409, and the key finished meanwhile", reply{status: 409}, finished, congestionClear},
		{"409 on a deleted key", reply{status: 409}, keyState{}, congestionClear},
		{"finished", reply{status: 201}, finished, congestionClear},
		{"500", reply{status: 500}, unfinished, congestionClear},
		{"422", reply{status: 422}, unfinished, congestionClear},
		{"no answer", reply{err: errors.New("connection refused")}, unfinished, congestionNone},
	} {
		if got := congestionOf(c.rep, c.st); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// The adaptive limit, driven by hand with an injected clock: a conflict
// halves it once per round of replays (replays that started before the
// decrease neither decrease nor raise it), clear replays raise it by one
// per limit's worth, never past --concurrency and never below 1, and a
// backoff episode is reported once when it starts and once when it ends.
func TestAIMD(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := newAIMD(8, true)
	if a.current() != 8 {
		t.Fatalf("starts at %d, want --concurrency 8", a.current())
	}
	// A round of 8 replays in flight; three of them conflict.
	var round []ticket
	for range 8 {
		round = append(round, a.start())
	}
	ch := a.done(round[0], congestionConflict, clock.Now())
	if want := (limitChange{from: 8, to: 4, backedOff: true}); ch != want {
		t.Fatalf("first conflict: %+v, want %+v", ch, want)
	}
	for _, tk := range round[1:3] {
		if ch := a.done(tk, congestionConflict, clock.Now()); ch.changed() || ch.backedOff {
			t.Fatalf("a conflict of a replay started before the decrease decreased again: %+v", ch)
		}
	}
	// The rest of the round ends clear, but ran under the old limit:
	// it raises nothing.
	for _, tk := range round[3:] {
		if ch := a.done(tk, congestionClear, clock.Now()); ch.changed() {
			t.Fatalf("a clear replay started before the decrease raised the limit: %+v", ch)
		}
	}
	// Replays started since: each raises the limit by 1/limit.
	for range 5 {
		a.done(a.start(), congestionClear, clock.Now())
	}
	if a.current() != 5 { // 4 + 5 × 1/4.x
		t.Fatalf("after 5 clear replays at 4: %d, want 5", a.current())
	}
	// A replay started after the decrease conflicts: halved again, but
	// the episode goes on (no second backoff report).
	clock.Advance(time.Second)
	ch = a.done(a.start(), congestionConflict, clock.Now())
	if ch.from != 5 || ch.to != 2 || ch.backedOff || ch.recovered {
		t.Fatalf("second decrease: %+v, want 5 -> 2 inside the episode", ch)
	}
	for range 3 {
		a.done(a.start(), congestionConflict, clock.Now())
	}
	if a.current() != 1 {
		t.Fatalf("never below 1: %d", a.current())
	}
	// A live request's 409 and a request without an answer change nothing.
	for _, c := range []congestion{congestionNone} {
		if ch := a.done(a.start(), c, clock.Now()); ch.changed() {
			t.Fatalf("%v changed the limit: %+v", c, ch)
		}
	}
	// Clear replays raise it by 1/limit each: from 1 to 8 in about
	// (8² - 1²)/2 of them, one round of replays per step.
	clock.Advance(time.Minute)
	clears, backs, recoveries := 0, 0, 0
	var last limitChange
	for a.current() < 8 {
		ch := a.done(a.start(), congestionClear, clock.Now())
		clears++
		if ch.backedOff {
			backs++
		}
		if ch.recovered {
			recoveries++
			last = ch
		}
		if clears > 100 {
			t.Fatal("the limit does not climb back")
		}
	}
	if clears != 31 {
		t.Errorf("%d clear replays from 1 to 8, want 31", clears)
	}
	if backs != 0 || recoveries != 1 || last.to != 8 || last.episode != time.Minute+time.Second {
		t.Errorf("recovery reported %d times (%+v), backoff %d times; want one recovery after the episode's 1m1s", recoveries, last, backs)
	}
	for range 10 {
		if ch := a.done(a.start(), congestionClear, clock.Now()); ch.changed() || ch.recovered {
			t.Fatalf("past --concurrency: %+v", ch)
		}
	}
	// A new conflict starts a new episode, reported once more.
	if ch := a.done(a.start(), congestionConflict, clock.Now()); !ch.backedOff || ch.to != 4 {
		t.Fatalf("a new episode: %+v", ch)
	}
}

// The fixed baseline (the tests' comparison) never moves; --concurrency 1
// has nothing to lower.
func TestAIMDFixed(t *testing.T) {
	now := time.Now()
	fixed := newAIMD(8, false)
	one := newAIMD(1, true)
	for range 5 {
		if ch := fixed.done(fixed.start(), congestionConflict, now); ch.changed() {
			t.Fatalf("fixed limit moved: %+v", ch)
		}
		if ch := one.done(one.start(), congestionConflict, now); ch.changed() || ch.backedOff {
			t.Fatalf("limit 1 moved: %+v", ch)
		}
	}
}

// The gate lets as many replays through as the limit says and holds the
// next one until a slot frees; when its context ends it lets it through.
func TestGate(t *testing.T) {
	a := newAIMD(2, true)
	g := newGate(a)
	ctx := context.Background()
	t1, t2 := g.acquire(ctx), g.acquire(ctx)
	// The conflict of t1 halves the limit to 1 while t2 is still in
	// flight: a third replay waits for t2 too.
	if ch := g.release(t1, congestionConflict, time.Now()); ch.to != 1 {
		t.Fatalf("limit %d after a conflict, want 1", ch.to)
	}
	got := make(chan ticket, 1)
	go func() { got <- g.acquire(ctx) }()
	select {
	case tk := <-got:
		t.Fatalf("ticket %d went through with one replay in flight at limit 1", tk)
	default:
	}
	g.release(t2, congestionNone, time.Now())
	select {
	case tk := <-got:
		if tk != 3 {
			t.Fatalf("ticket %d, want 3", tk)
		}
	case <-time.After(time.Minute):
		t.Fatal("a freed slot did not let the waiting replay through")
	}
	// At the limit, an ended context goes through at once.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if tk := g.acquire(cctx); tk != 4 {
		t.Fatalf("ticket %d, want 4", tk)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight != 2 {
		t.Fatalf("%d in flight, want 2", g.inFlight)
	}
}

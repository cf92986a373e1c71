package completer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/backoff"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// The outcome table of docs/completer.md, without a database: what the
// API answered and what the re-read row says decide the outcome, what the
// breaker is told and which statement records it.
func TestJudge(t *testing.T) {
	s := DefaultSettings()
	s.MaxAttempts = 5
	k := claimedKey{ID: 7, Path: "/charges", Attempts: 2}
	last := claimedKey{ID: 7, Path: "/charges", Attempts: 4} // the next failure is the 5th
	unfinished := keyState{exists: true, leaseOurs: true, recoveryPoint: "charge_created"}
	pastHorizon := unfinished
	pastHorizon.pastHorizon = true
	finished := keyState{exists: true, finished: true, leaseOurs: true, recoveryPoint: "finished"}
	notOurs := unfinished
	notOurs.leaseOurs = false
	held := unfinished // a live request holds the key
	held.locked = true
	heldPastHorizon := pastHorizon
	heldPastHorizon.locked = true
	form := s
	form.Encoding = EncodingForm
	status := func(code int) reply { return reply{status: code} }
	refused := reply{err: errors.New("dial tcp 127.0.0.1:1: connection refused")}
	timeout := reply{err: fmt.Errorf("Post %q: %w", "http://api/charges", timeoutErr{})}

	for _, c := range []struct {
		name     string
		k        claimedKey
		rep      reply
		st       keyState
		shutdown bool
		want     verdict
		errHas   string    // in lastError
		settings *Settings // s when nil
	}{
		{"gone, whatever the reply", k, status(500), keyState{}, false,
			verdict{outcome: OutcomeGone, breaker: noteSucceeded, write: writeUntrack}, "", nil},
		{"finished with 200", k, status(200), finished, false,
			verdict{outcome: OutcomeFinished, breaker: noteSucceeded, write: writeFinished}, "", nil},
		{"finished with a stored 402", k, status(402), finished, false,
			verdict{outcome: OutcomeFinished, breaker: noteSucceeded, write: writeFinished}, "", nil},
		{"finished with a stored 500", k, status(500), finished, false,
			verdict{outcome: OutcomeFinished, breaker: noteSucceeded, write: writeFinished}, "", nil},
		{"finished although the request failed", k, refused, finished, false,
			verdict{outcome: OutcomeFinished, breaker: noteSucceeded, write: writeFinished}, "", nil},
		{"lease taken over", k, status(500), notOurs, false,
			verdict{outcome: OutcomeLeaseLost, breaker: noteCancel, write: writeNothing}, "", nil},
		{"aborted by shutdown", k, reply{err: context.Canceled}, unfinished, true,
			verdict{outcome: OutcomeDeferred, breaker: noteCancel, write: writeRelease}, "", nil},
		{"409: a live request holds the key", k, status(409), held, false,
			verdict{outcome: OutcomeInProgress, breaker: noteSucceeded, write: writeInProgress}, "", nil},
		{"409 on a key no request holds: an attempt", k, status(409), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3, retryBase: conflictRetryBase}, "while no request held the key (its lock older than --lock-timeout 1m30s): most likely a parameter mismatch", nil},
		{"409 on a key no request holds, last attempt: give up naming the mismatch", last, status(409), unfinished, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteSucceeded, write: writeGiveUp, attempts: 5, giveUpWhy: "5 failed attempts (--max-attempts 5)", retryBase: conflictRetryBase}, "parameter mismatch", nil},
		{"409 on a key no request holds, past the horizon: give up", k, status(409), pastHorizon, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteSucceeded, write: writeGiveUp, attempts: 3, giveUpWhy: "past the give-up horizon of 23h0m0s after creation", retryBase: conflictRetryBase}, "parameter mismatch", nil},
		{"422 names the encoding", k, status(422), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, "the request encoding may be wrong: replays are sent as --request-encoding json (application/json); if the API reads form bodies, set --request-encoding form", nil},
		{"415 names the encoding", k, status(415), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, "415 Unsupported Media Type but the key is still at recovery point \"charge_created\": the request encoding may be wrong: replays are sent as --request-encoding json", nil},
		{"415 with form encoding names form", k, status(415), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, "replays are sent as --request-encoding form (application/x-www-form-urlencoded); if the API reads json bodies, set --request-encoding json", &form},
		{"422 on the last attempt: give up, the last error names the encoding", last, status(422), unfinished, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteSucceeded, write: writeGiveUp, attempts: 5, giveUpWhy: "5 failed attempts (--max-attempts 5)"}, "--request-encoding json", nil},
		{"connection error", k, refused, unfinished, false,
			verdict{outcome: OutcomeRetry, breaker: noteFailed, write: writeAttempt, attempts: 3}, "request failed: dial tcp", nil},
		{"timeout", k, timeout, unfinished, false,
			verdict{outcome: OutcomeRetry, breaker: noteFailed, write: writeAttempt, attempts: 3}, "timeout: ", nil},
		{"500", k, status(500), unfinished, false,
			verdict{outcome: OutcomeRetry, breaker: noteFailed, write: writeAttempt, attempts: 3}, "API answered 500 Internal Server Error", nil},
		{"503", k, status(503), unfinished, false,
			verdict{outcome: OutcomeRetry, breaker: noteFailed, write: writeAttempt, attempts: 3}, "503", nil},
		{"429", k, status(429), unfinished, false,
			verdict{outcome: OutcomeRetry, breaker: noteFailed, write: writeAttempt, attempts: 3}, "429", nil},
		{"401", k, status(401), unfinished, false,
			verdict{outcome: OutcomeUnauthorized, breaker: noteFailed, write: writeAttempt, attempts: 3}, "--auth-secret-file", nil},
		{"403 names the path", k, status(403), unfinished, false,
			verdict{outcome: OutcomeUnauthorized, breaker: noteFailed, write: writeAttempt, attempts: 3}, "replays on /charges", nil},
		{"400: the API is up, the key is not done", k, status(400), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, `still at recovery point "charge_created"`, nil},
		{"200 without finishing", k, status(200), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, "API answered 200", nil},
		{"302", k, status(302), unfinished, false,
			verdict{outcome: OutcomeRejected, breaker: noteSucceeded, write: writeAttempt, attempts: 3}, "302", nil},
		{"last attempt: give up", last, status(500), unfinished, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteFailed, write: writeGiveUp, attempts: 5, giveUpWhy: "5 failed attempts (--max-attempts 5)"}, "500", nil},
		{"last attempt rejected: give up, the breaker told the API answered", last, status(400), unfinished, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteSucceeded, write: writeGiveUp, attempts: 5, giveUpWhy: "5 failed attempts (--max-attempts 5)"}, "400", nil},
		{"failed past the horizon: give up", k, status(503), pastHorizon, false,
			verdict{outcome: OutcomeGaveUp, breaker: noteFailed, write: writeGiveUp, attempts: 3, giveUpWhy: "past the give-up horizon of 23h0m0s after creation"}, "503", nil},
		{"409 past the horizon: left for the live request", k, status(409), heldPastHorizon, false,
			verdict{outcome: OutcomeInProgress, breaker: noteSucceeded, write: writeInProgress}, "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := &s
			if c.settings != nil {
				set = c.settings
			}
			got := judge(c.k, c.rep, c.st, c.shutdown, set)
			if !strings.Contains(got.lastError, c.errHas) || (c.errHas == "") != (got.lastError == "") {
				t.Errorf("lastError %q, want it to contain %q", got.lastError, c.errHas)
			}
			got.lastError = ""
			if got != c.want {
				t.Errorf("verdict\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}

// Before the replay: a key claimed past the horizon is given up without a
// request; a key handed back unreplayed is deferred; a request needs the
// request timeout plus the margin of lease left.
func TestBeforeReplay(t *testing.T) {
	s := DefaultSettings()
	v, replay := atClaim(claimedKey{Attempts: 3, PastHorizon: true}, &s)
	if want := (verdict{outcome: OutcomeGaveUp, write: writeGiveUp, attempts: 3, giveUpWhy: "past the give-up horizon of 23h0m0s after creation"}); replay || v != want {
		t.Errorf("past the horizon at claim: %+v (replay %v), want %+v", v, replay, want)
	}
	if _, replay := atClaim(claimedKey{Attempts: 3}, &s); !replay {
		t.Error("a key inside the horizon is replayed")
	}
	for _, note := range []breakerNote{noteNone, noteCancel} {
		if v := deferred(note); v != (verdict{outcome: OutcomeDeferred, breaker: note, write: writeRelease}) {
			t.Errorf("deferred(%v) = %+v", note, v)
		}
	}
	need := s.RequestTimeout + leaseMargin
	if leaseTooShort(need, &s) || !leaseTooShort(need-time.Nanosecond, &s) {
		t.Errorf("a request needs exactly %s of lease", need)
	}
}

// When a pass claims another batch.
func TestPassGoesOn(t *testing.T) {
	const size = 10
	for _, c := range []struct {
		name        string
		b           Result
		breakerOpen bool
		want        bool
	}{
		{"full batch", Result{Claimed: size, Finished: size}, false, true},
		{"full batch, some deferred", Result{Claimed: size, Retried: 3, Deferred: 7}, true, true},
		{"full batch, all deferred", Result{Claimed: size, Deferred: size}, false, false},
		{"partial batch: drained", Result{Claimed: size - 1, Finished: size - 1}, false, false},
		{"nothing due", Result{}, false, false},
		{"breaker open", Result{BreakerOpen: true}, true, false},
		{"probe closed the breaker", Result{Claimed: 1, Finished: 1, Probe: true}, false, true},
		{"probe failed on its own (half-open)", Result{Claimed: 1, Retried: 1, Probe: true}, false, true},
		{"probe re-opened the breaker", Result{Claimed: 1, Retried: 1, Probe: true}, true, false},
		{"no probe to claim", Result{Probe: true}, false, false},
	} {
		if got := passGoesOn(&c.b, size, c.breakerOpen); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// When the next pass is due.
func TestNextPass(t *testing.T) {
	s := DefaultSettings()
	poll := s.PollInterval
	for _, c := range []struct {
		name        string
		last        *Result
		breakerLeft time.Duration
		retryLeft   time.Duration
		want        time.Duration
	}{
		{"drained, no retry", &Result{Claimed: 3}, 0, 0, poll},
		{"breaker open, cool-down ends first", &Result{BreakerOpen: true}, 2 * time.Second, 0, 2 * time.Second},
		{"breaker open, cool-down longer than a poll", &Result{BreakerOpen: true}, time.Minute, 0, poll},
		{"breaker opened during the pass, which ended drained", &Result{Claimed: 5, Retried: 5}, 2 * time.Second, 0, poll},
		{"a retry falls due before the next poll", &Result{Claimed: 5, Rejected: 1}, 0, 700 * time.Millisecond, 700*time.Millisecond + retryWakeMargin},
		{"a retry fell due during the pass", &Result{Claimed: 5, Rejected: 1}, 0, 0, retryWakeMargin},
		{"a retry falls due after the next poll", &Result{Claimed: 5, Rejected: 1}, 0, poll, poll},
		{"breaker open: its cool-down, not the retry", &Result{BreakerOpen: true}, 2 * time.Second, 100 * time.Millisecond, 2 * time.Second},
	} {
		retry := c.retryLeft > 0 || c.name == "a retry fell due during the pass"
		if got := nextPass(c.last, poll, c.breakerLeft, c.retryLeft, retry); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	// After failed passes the skeleton backs off from --poll-interval.
	r := passRetry(poll)
	for failures, ceiling := range map[int]time.Duration{1: poll, 2: 2 * poll, 3: maxPassRetry, 100: maxPassRetry} {
		if got := backoff.Ceiling(failures, r.Base, r.Max); got != ceiling {
			t.Fatalf("after %d failed passes: up to %s, want up to %s", failures, got, ceiling)
		}
	}
	if r := passRetry(5 * time.Minute); backoff.Ceiling(10, r.Base, r.Max) != 5*time.Minute {
		t.Errorf("a poll interval above %s caps the retry: %+v", maxPassRetry, r)
	}
}

// The retries a process scheduled wake its loop in order, each once.
func TestRetrySchedule(t *testing.T) {
	var r retrySchedule
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, ok := r.next(t0); ok {
		t.Fatalf("empty: %s, want none", got)
	}
	r.add(t0.Add(3 * time.Second))
	r.add(t0.Add(time.Second))
	r.add(t0.Add(2 * time.Second))
	// A retry that fell due while a pass ran is due at once, once.
	for _, c := range []struct {
		now  time.Duration
		want time.Duration
		ok   bool
	}{{0, time.Second, true}, {2500 * time.Millisecond, 0, true}, {2500 * time.Millisecond, 500 * time.Millisecond, true},
		{3500 * time.Millisecond, 0, true}, {3500 * time.Millisecond, 0, false}} {
		if got, ok := r.next(t0.Add(c.now)); got != c.want || ok != c.ok {
			t.Errorf("at +%s: %s %v, want %s %v", c.now, got, ok, c.want, c.ok)
		}
	}
	if len(r.due) != 0 {
		t.Errorf("%d retries kept after all fell due", len(r.due))
	}
}

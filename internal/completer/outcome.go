package completer

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// The outcome table of docs/completer.md as pure functions: given what the
// API answered and what the re-read row says, which Outcome a key gets,
// what the circuit breaker is told and which statement records it. They
// read and write nothing; process (completer.go) feeds them and applies
// their verdict.

// reply is what the API answered.
type reply struct {
	status int   // 0 when err != nil
	err    error // transport error or timeout
}

// keyState is the key's row as re-read after the replay (rereadSQL).
type keyState struct {
	exists      bool
	finished    bool
	leaseOurs   bool
	pastHorizon bool
	// locked: the API holds the key, its locked_at younger than
	// --lock-timeout (a live request, or one that died within it).
	locked        bool
	recoveryPoint string
}

// write is the statement that records a verdict.
type write int

const (
	writeNothing    write = iota // the lease is lost: the row is not ours to write
	writeUntrack                 // gone: drop its idemd_unfinished_keys row (untrackSQL)
	writeFinished                // clear the lease and stop tracking (finishedSQL)
	writeRelease                 // clear the lease, count nothing (releaseSQL)
	writeInProgress              // look again after --in-progress-delay (inProgressSQL)
	writeAttempt                 // a failed attempt, retried after backoff (attemptSQL)
	writeGiveUp                  // give up and flag for review (giveUpSQL, review.Flag)
)

func (w write) String() string {
	return [...]string{"nothing", "untrack", "finished", "release", "in_progress", "attempt", "give_up"}[w]
}

// breakerNote is what a verdict tells the circuit breaker about the
// request it allowed.
type breakerNote int

const (
	noteNone      breakerNote = iota // no request was allowed
	noteSucceeded                    // the API answered (breaker.Succeeded)
	noteFailed                       // the request failed (breaker.Failed decides whose fault)
	noteCancel                       // the request tells nothing: not sent, aborted, or its result unknown (breaker.Cancel)
)

func (n breakerNote) String() string {
	return [...]string{"none", "succeeded", "failed", "cancel"}[n]
}

// verdict is what becomes of one claimed key.
type verdict struct {
	// outcome is the key's Outcome if the write finds our lease (a write
	// that finds it gone makes the outcome OutcomeLeaseLost).
	outcome Outcome
	breaker breakerNote
	write   write
	// attempts is the completer_attempts writeAttempt and writeGiveUp
	// record; lastError the completer_last_error they record (writeGiveUp
	// keeps the one recorded before when it is empty).
	attempts  int
	lastError string
	// giveUpWhy says why writeGiveUp gives up, for the review's detail.
	giveUpWhy string
	// retryBase, when not zero, replaces --backoff-base for the retry
	// writeAttempt schedules (a conflict's: conflictRetryBase).
	retryBase time.Duration
}

// conflictRetryBase caps the first retry of a 409 on a key no request
// holds. With the article's API that is mostly a serialization failure
// between the completer's own concurrent replays: it clears as soon as
// the adaptive limit (congestion.go) has cut the replays in flight, so a
// retry within a second finds it cleared, where --backoff-base (10 s)
// would stretch a drain the conflicts barely slowed. A parameter
// mismatch, which never clears, still doubles from here to --backoff-max
// and counts towards --max-attempts.
const conflictRetryBase = time.Second

// atClaim is the verdict on a key before its replay: a key claimed past
// the give-up horizon is given up without a request; ok means replay it.
func atClaim(k claimedKey, s *Settings) (v verdict, ok bool) {
	if k.PastHorizon {
		return verdict{outcome: OutcomeGaveUp, write: writeGiveUp, attempts: k.Attempts, giveUpWhy: horizonWhy(s)}, false
	}
	return verdict{}, true
}

// deferred is the verdict on a key handed back unreplayed: the breaker
// did not allow the request (noteNone), or allowed one that was never sent
// (noteCancel: the rate limiter gave up, or too little lease was left).
func deferred(note breakerNote) verdict {
	return verdict{outcome: OutcomeDeferred, breaker: note, write: writeRelease}
}

// leaseTooShort reports whether a request may not be sent with left of
// the lease remaining: it could outlive the lease (and another replica
// claim the key mid-request) before the writes after it are done.
func leaseTooShort(left time.Duration, s *Settings) bool {
	return left < s.RequestTimeout+leaseMargin
}

// judge is the verdict on a replayed key. The database is the truth: a
// finished row is finished whatever came back, a gone row is gone, and a
// row whose lease is no longer ours is left alone. Otherwise the reply
// decides. shuttingDown says the request's context was cancelled by us
// (Stop's deadline): a failed request then says nothing about the API.
func judge(k claimedKey, rep reply, st keyState, shuttingDown bool, s *Settings) verdict {
	switch {
	case !st.exists:
		return verdict{outcome: OutcomeGone, breaker: noteSucceeded, write: writeUntrack}
	case st.finished:
		// A stored 402, or even a stored 500, is a final answer.
		return verdict{outcome: OutcomeFinished, breaker: noteSucceeded, write: writeFinished}
	case !st.leaseOurs:
		return verdict{outcome: OutcomeLeaseLost, breaker: noteCancel, write: writeNothing}
	case rep.err != nil && shuttingDown:
		// The request was aborted by us, not failed.
		return deferred(noteCancel)
	case rep.err != nil:
		return failed(k, st, s, OutcomeRetry, noteFailed, "request failed: "+describeErr(rep.err), "")
	case rep.status == http.StatusConflict && st.locked:
		return verdict{outcome: OutcomeInProgress, breaker: noteSucceeded, write: writeInProgress}
	case rep.status == http.StatusConflict:
		// No request holds the key, so the 409 was about this replay: the
		// API compared the stored parameters with the key's and found them
		// different (the article's API answers a mismatch with 409), or its
		// transaction met a serialization failure. A mismatch never clears,
		// so it must count towards --max-attempts; a serialization failure
		// is retried after a short backoff (conflictRetryBase), and the
		// adaptive concurrency (congestion.go) makes it rare.
		v := failed(k, st, s, OutcomeRejected, noteSucceeded, fmt.Sprintf(
			"API answered %d %s while no request held the key (its lock older than --lock-timeout %s)",
			rep.status, http.StatusText(rep.status), s.LockTimeout), conflictHint)
		v.retryBase = min(s.BackoffBase, conflictRetryBase)
		return v
	case rep.status >= 500 || rep.status == http.StatusTooManyRequests:
		return failed(k, st, s, OutcomeRetry, noteFailed, fmt.Sprintf("API answered %d %s", rep.status, http.StatusText(rep.status)), "")
	case rep.status == http.StatusUnauthorized || rep.status == http.StatusForbidden:
		// A misconfigured secret looks like this on every key: it counts
		// against the breaker so attempts burn slowly while an operator
		// fixes it. (With a wrong secret no key ever succeeds, so none of
		// these is taken for a key's own failure.)
		return failed(k, st, s, OutcomeUnauthorized, noteFailed, fmt.Sprintf(
			"API answered %d %s to the signed replay of an unfinished key: the completer's --auth-secret-file does not match the API's replay secret, or the API does not accept replays on %s",
			rep.status, http.StatusText(rep.status), k.Path), "")
	case rep.status == http.StatusUnsupportedMediaType || rep.status == http.StatusUnprocessableEntity:
		// The body as sent was refused: most often an API that reads
		// another encoding than the one replays are sent in.
		return failed(k, st, s, OutcomeRejected, noteSucceeded, fmt.Sprintf(
			"API answered %d %s but the key is still at recovery point %q", rep.status, http.StatusText(rep.status), st.recoveryPoint),
			encodingHint(s.Encoding))
	default:
		// The API answered deliberately: it is up, whatever this key's
		// problem is.
		return failed(k, st, s, OutcomeRejected, noteSucceeded, fmt.Sprintf(
			"API answered %d %s but the key is still at recovery point %q", rep.status, http.StatusText(rep.status), st.recoveryPoint), "")
	}
}

// conflictHint says what a 409 on a key no request holds means.
const conflictHint = "most likely a parameter mismatch (the API finds the stored request_params differ from the key's; that never clears), or a serialization failure in the API's transaction"

// encodingHint says what a 415 or 422 to a replay may mean: the body is
// sent as --request-encoding e and the API reads another encoding.
func encodingHint(e Encoding) string {
	other := EncodingForm
	if e == EncodingForm {
		other = EncodingJSON
	}
	return fmt.Sprintf("the request encoding may be wrong: replays are sent as --request-encoding %s (%s); if the API reads %s bodies, set --request-encoding %s (or the API found the parameters differ from the key's)",
		e, contentType(e), other, other)
}

// failed is the verdict on a failed attempt: o, retried after backoff, or
// given up when the attempts or the horizon are exhausted. msg says what
// happened; hint, when not empty, what it likely means: both are the
// last error, which the log line, completer_last_error and a give-up's
// review detail carry, so they name the likely cause, not only the
// symptom.
func failed(k claimedKey, st keyState, s *Settings, o Outcome, note breakerNote, msg, hint string) verdict {
	if hint != "" {
		msg += ": " + hint
	}
	v := verdict{outcome: o, breaker: note, write: writeAttempt, attempts: k.Attempts + 1, lastError: msg}
	switch {
	case v.attempts >= s.MaxAttempts:
		v.outcome, v.write = OutcomeGaveUp, writeGiveUp
		v.giveUpWhy = fmt.Sprintf("%d failed attempts (--max-attempts %d)", v.attempts, s.MaxAttempts)
	case st.pastHorizon:
		v.outcome, v.write = OutcomeGaveUp, writeGiveUp
		v.giveUpWhy = horizonWhy(s)
	}
	return v
}

func horizonWhy(s *Settings) string {
	return fmt.Sprintf("past the give-up horizon of %s after creation", s.GiveUpAfter)
}

// describeErr renders a transport error without anything secret: the
// request's URL (already stripped of any password by net/http) and the
// cause, never headers.
func describeErr(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout: " + err.Error()
	}
	return err.Error()
}

package completer

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/review"
)

// The re-read and the writes after a replay run even when shutdown
// cancelled the replay (the request may have reached the API): on a
// context without the shutdown's end, each one call bounded by
// --database-timeout.
const (
	rereadOp = "completer: re-read"
	writeOp  = "completer: write"
)

// process drives one leased key and returns its outcome: the verdict
// (outcome.go) on what it finds, applied by settle.
func (s *Service) process(ctx context.Context, k claimedKey, leaseDeadline time.Time) Outcome {
	log := s.log.With(zap.Int64("key_id", k.ID), zap.Int64("user_id", k.UserID))
	if v, replay := atClaim(k, &s.cfg.Settings); !replay {
		return s.settle(ctx, log, k, v)
	}
	// The slot is held until the verdict is written: the writes touch
	// the rows the API's next transactions read.
	t := s.conc.acquire(ctx)
	cong := congestionNone
	defer func() { s.concurrencyChanged(s.conc.release(t, cong, s.now())) }()
	if !s.breaker.Allow() {
		return s.settle(ctx, log, k, deferred(noteNone))
	}
	if err := s.waitRate(ctx); err != nil {
		return s.settle(ctx, log, k, deferred(noteCancel))
	}
	if leaseTooShort(time.Until(leaseDeadline), &s.cfg.Settings) {
		// Hand the key back rather than risk another replica claiming it
		// mid-request.
		return s.settle(ctx, log, k, deferred(noteCancel))
	}

	tc := replayTrace()
	log = log.With(zap.String("trace_id", tc.TraceID().String()))
	start := time.Now()
	rep := s.send(ctx, k, tc)
	s.metrics.duration.Observe(time.Since(start).Seconds())

	wctx := context.WithoutCancel(ctx)
	st, err := s.reread(wctx, k)
	if err != nil {
		s.breaker.Cancel()
		log.Error("re-read after replay failed; the lease will expire", zap.Error(err))
		return OutcomeLeaseLost
	}
	cong = congestionOf(rep, st)
	return s.settle(wctx, log, k, judge(k, rep, st, ctx.Err() != nil, &s.cfg.Settings))
}

// settle tells the breaker what v says of the request, then writes what v
// says to write, and returns the key's outcome: v's, or OutcomeLeaseLost
// when the write no longer finds our lease.
func (s *Service) settle(ctx context.Context, log *zap.Logger, k claimedKey, v verdict) Outcome {
	switch v.breaker {
	case noteSucceeded:
		s.breaker.Succeeded(k.ID)
	case noteFailed:
		s.breakerFailed(log, k)
	case noteCancel:
		s.breaker.Cancel()
	}
	switch v.write {
	case writeUntrack:
		if err := s.exec(ctx, untrackSQL, keyArgs(k)); err != nil {
			log.Warn("untracking a deleted key failed (harmless: the next prune removes it)", zap.Error(err))
		}
	case writeFinished:
		s.markFinished(ctx, log, k)
	case writeRelease:
		s.release(ctx, log, k)
	case writeInProgress:
		return s.inProgress(ctx, log, k)
	case writeAttempt:
		return s.recordAttempt(ctx, log, k, v)
	case writeGiveUp:
		return s.giveUp(ctx, log, k, v)
	case writeNothing:
		log.Warn("lease lost during replay")
	}
	return v.outcome
}

// exec runs one of a key's writes, a call bounded by --database-timeout.
func (s *Service) exec(ctx context.Context, sql string, args pgx.NamedArgs) error {
	_, err := s.execTag(ctx, sql, args)
	return err
}

// execTag is exec returning the statement's tag.
func (s *Service) execTag(ctx context.Context, sql string, args pgx.NamedArgs) (tag pgconn.CommandTag, err error) {
	err = s.calls.Do(ctx, writeOp, func(ctx context.Context) (err error) {
		tag, err = s.pool.Exec(ctx, sql, args)
		return err
	})
	return tag, err
}

// keyArgs names k for the statements after its claim.
func keyArgs(k claimedKey) pgx.NamedArgs {
	return pgx.NamedArgs{"key_id": k.ID, "tracked_at": k.TrackedAt, "leased_until": k.Lease}
}

// breakerFailed tells the breaker that k's request failed and logs when the
// failure was taken for the key's own (it then leaves the breaker alone).
func (s *Service) breakerFailed(log *zap.Logger, k claimedKey) {
	if s.breaker.Failed(k.ID, k.Attempts) == keyFailure {
		// Counted, so a key failing on its own is visible before its
		// give-up flags it (IdemdCompleterFlagging then fires).
		s.metrics.keyFailures.Inc()
		log.Debug("key fails while the API answers other keys: its failure does not count against the API",
			zap.Int("attempts", k.Attempts+1))
	}
}

// waitRate blocks until the global limiter lets one request go.
func (s *Service) waitRate(ctx context.Context) error {
	// Reservations are made under a mutex so the limiter sees
	// non-decreasing times: a reservation stamped earlier than the previous
	// one makes x/time/rate refill the overlap twice.
	s.rateMu.Lock()
	now := s.now()
	r := s.limiter.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if s.hooks.reserved != nil && r.OK() {
		s.hooks.reserved(now.Add(d))
	}
	s.rateMu.Unlock()
	if !r.OK() {
		return errors.New("rate limiter refused")
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		r.CancelAt(s.now())
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// replayTrace is the trace context of one replay attempt: a new trace, a
// new span id, sampled. The completer records no spans itself; the
// traceparent header starts a trace for the API's handling of the replay
// (a parent-based sampler keeps it), and the trace id is on the completer's
// log lines about the attempt, so one finds the other.
func replayTrace() trace.SpanContext {
	var cfg trace.SpanContextConfig
	for !cfg.TraceID.IsValid() {
		_, _ = rand.Read(cfg.TraceID[:]) // never fails (crypto/rand)
	}
	for !cfg.SpanID.IsValid() {
		_, _ = rand.Read(cfg.SpanID[:])
	}
	cfg.TraceFlags = trace.FlagsSampled
	return trace.NewSpanContext(cfg)
}

// send replays k's stored request, with tc as its W3C traceparent.
func (s *Service) send(ctx context.Context, k claimedKey, tc trace.SpanContext) reply {
	body, ctype, err := encodeBody(s.cfg.Encoding, k.Params)
	if err != nil {
		return reply{err: err}
	}
	sig, err := s.cfg.Signer.Sign(replayauth.Request{
		Method: k.Method, Path: k.Path, UserID: k.UserID, IdempotencyKey: k.Key, Body: body,
	})
	if err != nil {
		return reply{err: err}
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	u := *s.base
	u.Path = strings.TrimRight(s.base.Path, "/") + k.Path
	u.RawPath = ""
	req, err := http.NewRequestWithContext(rctx, strings.ToUpper(k.Method), u.String(), strings.NewReader(string(body)))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set(replayauth.IdempotencyKeyHeader, k.Key)
	req.Header.Set(replayauth.Header, sig)
	req.Header.Set("User-Agent", "idemd-completer")
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(rctx, tc), propagation.HeaderCarrier(req.Header))
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	return reply{status: resp.StatusCode}
}

// reread reads the key's row after its replay (rereadSQL).
func (s *Service) reread(ctx context.Context, k claimedKey) (keyState, error) {
	st := keyState{exists: true}
	err := s.calls.Do(ctx, rereadOp, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, rereadSQL, pgx.NamedArgs{"key_id": k.ID, "leased_until": k.Lease, "give_up_after": s.cfg.GiveUpAfter, "lock_timeout": s.cfg.LockTimeout}).
			Scan(&st.recoveryPoint, &st.finished, &st.leaseOurs, &st.pastHorizon, &st.locked)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return keyState{}, nil
	}
	return st, err
}

// markFinished clears our bookkeeping on a finished key and stops tracking
// it.
func (s *Service) markFinished(ctx context.Context, log *zap.Logger, k claimedKey) {
	if err := s.exec(ctx, finishedSQL, keyArgs(k)); err != nil {
		log.Warn("clearing the lease of a finished key failed (harmless: finished keys are never claimed)", zap.Error(err))
	}
	log.Debug("key finished")
}

// release hands a key back without counting an attempt.
func (s *Service) release(ctx context.Context, log *zap.Logger, k claimedKey) {
	if err := s.exec(context.WithoutCancel(ctx), releaseSQL, keyArgs(k)); err != nil {
		log.Warn("releasing a lease failed; it will expire", zap.Error(err))
	}
}

func (s *Service) inProgress(ctx context.Context, log *zap.Logger, k claimedKey) Outcome {
	args := keyArgs(k)
	args["in_progress_delay"] = s.cfg.InProgressDelay
	tag, err := s.execTag(ctx, inProgressSQL, args)
	if err != nil {
		log.Error("recording in-progress failed; the lease will expire", zap.Error(err))
		return OutcomeLeaseLost
	}
	if tag.RowsAffected() == 0 {
		return OutcomeLeaseLost
	}
	log.Debug("key in progress (409), left alone")
	return OutcomeInProgress
}

// recordAttempt records a failed attempt, to be retried after
// backoff.Delay.
func (s *Service) recordAttempt(ctx context.Context, log *zap.Logger, k claimedKey, v verdict) Outcome {
	base := s.cfg.BackoffBase
	if v.retryBase > 0 {
		base = v.retryBase
	}
	delay := backoff.Delay(v.attempts, base, s.cfg.BackoffMax, s.jitter)
	args := keyArgs(k)
	args["attempts"], args["last_error"], args["retry_in"], args["give_up_after"] = v.attempts, v.lastError, delay, s.cfg.GiveUpAfter
	tag, err := s.execTag(ctx, attemptSQL, args)
	if err != nil {
		log.Error("recording a failed attempt failed; the lease will expire", zap.Error(err))
		return OutcomeLeaseLost
	}
	if tag.RowsAffected() == 0 {
		return OutcomeLeaseLost
	}
	if delay < s.cfg.PollInterval {
		// Due before the next poll: the loop wakes for it (nextPass).
		s.retries.add(s.now().Add(delay))
	}
	lvl := zap.InfoLevel
	if v.outcome == OutcomeUnauthorized {
		lvl = zap.ErrorLevel
	}
	log.Log(lvl, "replay failed, will retry", zap.String("outcome", string(v.outcome)), zap.Int("attempts", v.attempts),
		zap.Duration("retry_in", delay), zap.String("error", v.lastError))
	return v.outcome
}

// giveUp sets completer_gave_up_at, stops tracking the key and flags it
// for review in one transaction, only if we still hold the lease and the
// key is unfinished.
func (s *Service) giveUp(ctx context.Context, log *zap.Logger, k claimedKey, v verdict) Outcome {
	detail := "completer gave up: " + v.giveUpWhy
	if v.lastError != "" {
		detail += "; last error: " + v.lastError
	}
	args := keyArgs(k)
	args["attempts"], args["last_error"] = v.attempts, v.lastError
	var outcome Outcome
	err := s.calls.Do(context.WithoutCancel(ctx), writeOp, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, giveUpSQL, args)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				outcome = OutcomeLeaseLost
				return nil
			}
			if _, err := tx.Exec(ctx, untrackSQL, args); err != nil {
				return err
			}
			if _, err := review.Flag(ctx, tx, k.ID, review.ReasonCompleterGaveUp, detail, FlaggedBy); err != nil {
				return err
			}
			outcome = OutcomeGaveUp
			return nil
		})
	})
	if err != nil {
		log.Error("giving up failed; the lease will expire and the key be retried", zap.Error(err))
		return OutcomeLeaseLost
	}
	if outcome == OutcomeGaveUp {
		s.breaker.Forget(k.ID)
		log.Warn("gave up on key, flagged for review", zap.String("reason", review.ReasonCompleterGaveUp), zap.String("detail", detail))
	}
	return outcome
}

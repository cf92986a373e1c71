// Package completer drives abandoned idempotency keys to finished: it finds
// keys whose client gave up, leases a batch of them in the row (so replicas
// never replay one key at once) and replays each stored request against the
// API through the signed internal path (idem/replayauth). It never makes a
// side effect itself: the API owns the atomic phases; every write the
// completer does checks the state it expects (its own lease).
//
// The shape follows River's maintenance services (job_cleaner.go): a
// Service with a validated Config, Start/Stop, and a runOnce that returns a
// result struct which tests call directly.
package completer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"idemd/idem/replayauth"
	"idemd/internal/lifecycle"
	"idemd/internal/review"
)

// FlaggedBy is recorded in idempotency_key_reviews.flagged_by.
const FlaggedBy = "completer"

// Result is what one runOnce did.
type Result struct {
	Claimed      int
	Finished     int
	InProgress   int
	Retried      int // 5xx, 429, timeouts, connection errors
	Unauthorized int // 401/403 on an unfinished key
	Rejected     int // other answers that left the key unfinished
	GaveUp       int
	Deferred     int // released without a request
	LeaseLost    int
	Gone         int
	// BreakerOpen: nothing was claimed because the breaker is open.
	BreakerOpen bool
	// Probe: the breaker was half-open and the pass claimed one probe.
	Probe bool
}

func (r *Result) add(o Outcome) {
	switch o {
	case OutcomeFinished:
		r.Finished++
	case OutcomeInProgress:
		r.InProgress++
	case OutcomeRetry:
		r.Retried++
	case OutcomeUnauthorized:
		r.Unauthorized++
	case OutcomeRejected:
		r.Rejected++
	case OutcomeGaveUp:
		r.GaveUp++
	case OutcomeDeferred:
		r.Deferred++
	case OutcomeLeaseLost:
		r.LeaseLost++
	case OutcomeGone:
		r.Gone++
	}
}

// Add accumulates o into r (for sweep totals).
func (r *Result) Add(o Result) {
	r.Claimed += o.Claimed
	r.Finished += o.Finished
	r.InProgress += o.InProgress
	r.Retried += o.Retried
	r.Unauthorized += o.Unauthorized
	r.Rejected += o.Rejected
	r.GaveUp += o.GaveUp
	r.Deferred += o.Deferred
	r.LeaseLost += o.LeaseLost
	r.Gone += o.Gone
	r.BreakerOpen = r.BreakerOpen || o.BreakerOpen
	r.Probe = r.Probe || o.Probe
}

// Service is the completer.
type Service struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *zap.Logger
	client  *http.Client
	base    *url.URL
	limiter *rate.Limiter
	breaker *breaker
	metrics *metrics

	// Test seams.
	now       func() time.Time    // limiter and breaker clock
	jitter    func(n int64) int64 // uniform in [0, n)
	onReserve func(at time.Time)  // when each rate-limited request may go
	onOutcome func(id int64, o Outcome)

	rateMu sync.Mutex

	mu         sync.Mutex
	runner     lifecycle.Runner
	lastGauges time.Time
	lastPrune  time.Time
}

// New validates cfg and returns a Service.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if p := cfg.Problems(); len(p) > 0 {
		return nil, fmt.Errorf("completer: invalid config: %s", strings.Join(p, "; "))
	}
	if cfg.Signer == nil {
		return nil, errors.New("completer: invalid config: a Signer is required")
	}
	if pool == nil {
		return nil, errors.New("completer: a pool is required")
	}
	base, _ := url.Parse(strings.TrimRight(cfg.APIURL, "/"))
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	client := cfg.HTTPClient
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.Concurrency
		client = &http.Client{
			Transport: tr,
			// A redirect would carry a signed replay somewhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	s := &Service{
		cfg:     cfg,
		pool:    pool,
		log:     log,
		client:  client,
		base:    base,
		limiter: rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst),
		metrics: newMetrics(cfg.Registry),
		now:     time.Now,
		jitter:  rand.Int64N,
		runner:  lifecycle.Runner{Name: "completer"},
	}
	s.breaker = newBreaker(func() time.Time { return s.now() }, cfg.BreakerFailures, cfg.BreakerCooldown, cfg.BreakerMaxCooldown, s.breakerChanged)
	return s, nil
}

func (s *Service) breakerChanged(from, to BreakerState) {
	s.metrics.breakerState.Set(float64(to))
	if to == BreakerOpen {
		s.metrics.breakerOpens.Inc()
	}
	s.log.Info("circuit breaker state changed", zap.Stringer("from", from), zap.Stringer("to", to))
}

// Start runs the completer loop in the background until Stop (or until ctx
// is cancelled, after which it stops claiming; in-flight replays are only
// aborted by Stop's deadline).
func (s *Service) Start(ctx context.Context) error {
	return s.runner.Start(ctx, func(work context.Context, stop <-chan struct{}) {
		s.loop(ctx, work, stop)
	})
}

// Stop stops claiming, lets the current batch finish until ctx's deadline,
// then aborts what is left (those leases simply expire) and returns.
func (s *Service) Stop(ctx context.Context) error {
	return s.runner.Stop(ctx)
}

func (s *Service) loop(parent, ctx context.Context, stopClaims <-chan struct{}) {
	stopping := func() bool {
		select {
		case <-stopClaims:
			return true
		case <-parent.Done():
			return true
		default:
			return false
		}
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-stopClaims:
			return
		case <-parent.Done():
			return
		case <-timer.C:
		}
		s.maybePrune(ctx)
		s.maybeRefreshGauges(ctx, false)
		wait := s.cfg.PollInterval
		for !stopping() {
			res, err := s.runOnce(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Error("completer pass failed", zap.Error(err))
				break
			}
			if s.cfg.Ready != nil {
				s.cfg.Ready.MarkPass(time.Now())
			}
			if res.Claimed > 0 {
				s.log.Info("completer pass",
					zap.Int("claimed", res.Claimed), zap.Int("finished", res.Finished),
					zap.Int("in_progress", res.InProgress), zap.Int("retried", res.Retried),
					zap.Int("unauthorized", res.Unauthorized), zap.Int("rejected", res.Rejected),
					zap.Int("gave_up", res.GaveUp), zap.Int("deferred", res.Deferred),
					zap.Int("lease_lost", res.LeaseLost), zap.Int("gone", res.Gone))
			}
			if res.BreakerOpen {
				if r := s.breaker.Remaining(); r > 0 && r < wait {
					wait = r
				}
				break
			}
			s.maybeRefreshGauges(ctx, false)
			if res.Probe && res.Claimed > 0 && s.breaker.State() != BreakerOpen {
				// The probe closed the breaker (or failed on its own
				// account): carry on at --rate rather than wait a poll
				// interval with the API back.
				continue
			}
			if res.Claimed < s.cfg.BatchSize || res.Deferred == res.Claimed {
				break // drained what is due right now
			}
		}
		s.maybeRefreshGauges(ctx, true)
		timer.Reset(wait)
	}
}

// Sweep claims and processes batches until no candidate is due right now
// (or the breaker opens), and returns the totals. It is --once.
func (s *Service) Sweep(ctx context.Context) (Result, error) {
	var total Result
	defer s.maybeRefreshGauges(ctx, true)
	s.maybePrune(ctx)
	for {
		res, err := s.runOnce(ctx)
		total.Add(res)
		if err != nil {
			return total, err
		}
		if res.BreakerOpen || res.Claimed == 0 || res.Deferred == res.Claimed {
			return total, nil
		}
	}
}

// CandidateSQL selects up to $1 due candidates (their id and the
// created_at they are tracked under) and locks them, skipping rows another
// replica or the API holds. $2 grace, $3 idle, $4 lock timeout. Exported
// for completerbench.
//
// It indexes nothing the API updates (migrations.APIUpdatedColumns): it
// walks idemd_unfinished_keys, which a trigger fills when a key is inserted
// unfinished and the completer empties of keys that finished, were given
// up or deleted (untrack, Prune), in its primary key's (created_at, key_id)
// order, up to the grace period, and checks each key's row through the
// primary key of idempotency_keys. Its cost follows the backlog, not the
// table. The row's own columns decide: the tracked created_at only orders
// the walk and bounds it.
const CandidateSQL = `
    SELECT c.id, u.created_at AS tracked_at
    FROM idemd_unfinished_keys u
    JOIN idempotency_keys c ON c.id = u.key_id
    WHERE u.created_at < now() - $2::interval
      AND c.recovery_point <> 'finished'
      AND c.completer_gave_up_at IS NULL
      AND c.created_at < now() - $2::interval
      AND c.last_run_at < now() - $3::interval
      AND (c.locked_at IS NULL OR c.locked_at < now() - $4::interval)
      AND (c.completer_next_attempt_at IS NULL OR c.completer_next_attempt_at <= now())
      AND (c.completer_leased_until IS NULL OR c.completer_leased_until < now())
    ORDER BY u.created_at, u.key_id
    LIMIT $1
    FOR UPDATE OF c SKIP LOCKED`

// CandidateLocking is the row-locking clause of CandidateSQL (completerbench
// times the selection without it).
const CandidateLocking = "FOR UPDATE OF c SKIP LOCKED"

// claimSQL leases the candidates in the same statement that selects them,
// so two replicas can never both lease a key. $5 lease, $6 give-up horizon.
const claimSQL = `
UPDATE idempotency_keys k
SET completer_leased_until = now() + $5::interval
FROM (` + CandidateSQL + `) cand
WHERE k.id = cand.id
RETURNING k.id, k.user_id, k.idempotency_key, k.request_method, k.request_path,
          k.request_params, k.completer_attempts, k.completer_leased_until,
          k.created_at + $6::interval <= now() AS past_horizon, cand.tracked_at`

// untrackSQL deletes a key's row from idemd_unfinished_keys once the key is
// finished, given up or gone: none of those ever becomes a candidate again.
// $1 key id, $2 the created_at it is tracked under.
const untrackSQL = `DELETE FROM idemd_unfinished_keys WHERE created_at = $2 AND key_id = $1`

// pruneSQL walks up to $3 rows of idemd_unfinished_keys after the cursor
// ($1, $2) and deletes those whose key is finished, given up or gone
// (finished by the API itself, or reaped). It returns how many it walked
// and deleted, and the cursor to continue from.
const pruneSQL = `
WITH walked AS (
    SELECT u.created_at, u.key_id,
           k.id IS NULL OR k.recovery_point = 'finished' OR k.completer_gave_up_at IS NOT NULL AS done
    FROM idemd_unfinished_keys u
    LEFT JOIN idempotency_keys k ON k.id = u.key_id
    WHERE (u.created_at, u.key_id) > ($1::timestamptz, $2::bigint)
    ORDER BY u.created_at, u.key_id
    LIMIT $3
),
pruned AS (
    DELETE FROM idemd_unfinished_keys u
    USING walked w
    WHERE w.done AND u.created_at = w.created_at AND u.key_id = w.key_id
    RETURNING 1
),
last AS (
    SELECT created_at, key_id FROM walked ORDER BY created_at DESC, key_id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM walked), (SELECT count(*) FROM pruned),
       COALESCE((SELECT created_at FROM last), $1), COALESCE((SELECT key_id FROM last), $2)`

// pruneBatch is the rows one pruneSQL statement walks.
const pruneBatch = 1000

type claimedKey struct {
	ID          int64
	UserID      int64
	Key         string
	Method      string
	Path        string
	Params      []byte
	Attempts    int
	Lease       time.Time
	PastHorizon bool
	TrackedAt   time.Time // its idemd_unfinished_keys.created_at
}

// runOnce claims one batch and processes it with bounded concurrency.
func (s *Service) runOnce(ctx context.Context) (Result, error) {
	var res Result
	limit := s.cfg.BatchSize
	switch s.breaker.State() {
	case BreakerOpen:
		res.BreakerOpen = true
		return res, nil
	case BreakerHalfOpen:
		limit = 1 // one probe (claimProbe chooses which)
	}
	// The lease is measured from before the claim on the local monotonic
	// clock: the database's now()+lease is at least this late.
	leaseDeadline := time.Now().Add(s.cfg.Lease)
	var keys []claimedKey
	var err error
	if limit == 1 {
		res.Probe = true
		keys, err = s.claimProbe(ctx)
	} else {
		keys, err = s.claim(ctx, limit)
	}
	if err != nil {
		return res, err
	}
	res.Claimed = len(keys)
	s.metrics.claimed.Add(float64(len(keys)))

	var mu sync.Mutex
	work := make(chan claimedKey)
	var wg sync.WaitGroup
	n := min(s.cfg.Concurrency, len(keys))
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				o := s.process(ctx, k, leaseDeadline)
				s.metrics.replays.WithLabelValues(string(o)).Inc()
				if s.onOutcome != nil {
					s.onOutcome(k.ID, o)
				}
				mu.Lock()
				res.add(o)
				mu.Unlock()
			}
		}()
	}
	for _, k := range dispatchOrder(keys, s.breaker.Suspect) {
		work <- k
	}
	close(work)
	wg.Wait()
	return res, nil
}

func (s *Service) claim(ctx context.Context, limit int) ([]claimedKey, error) {
	return s.claimWith(ctx, claimSQL, limit)
}

// claimWith runs claimSQL or claimOneSQL (extra holds the latter's $7).
func (s *Service) claimWith(ctx context.Context, sql string, limit int, extra ...any) ([]claimedKey, error) {
	args := append([]any{limit, s.cfg.Grace, s.cfg.Idle, s.cfg.LockTimeout, s.cfg.Lease, s.cfg.GiveUpAfter}, extra...)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("completer: claim: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimedKey, error) {
		var k claimedKey
		err := r.Scan(&k.ID, &k.UserID, &k.Key, &k.Method, &k.Path, &k.Params, &k.Attempts, &k.Lease, &k.PastHorizon, &k.TrackedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("completer: claim: %w", err)
	}
	return keys, nil
}

// dispatchOrder is the order a claimed batch (in claim order, oldest first)
// is sent in. Keys that keep failing pile up at the front of the claim
// order (they are old and their short first backoffs keep them due), so
// sending the batch oldest-first lines them up into the streak of
// consecutive failures that opens the breaker. Alternating the oldest and
// the newest of the batch puts a key that can succeed between any two of
// them; a real outage fails every key in any order and still opens the
// breaker after --breaker-failures. Suspect keys (failing on their own,
// breaker.Suspect) go last: their failures count neither way, and the keys
// that can finish should not wait behind them for the rate limiter.
func dispatchOrder(keys []claimedKey, suspect func(id int64, attempts int) bool) []claimedKey {
	var ok, bad []claimedKey
	for _, k := range keys {
		if suspect(k.ID, k.Attempts) {
			bad = append(bad, k)
		} else {
			ok = append(ok, k)
		}
	}
	out := make([]claimedKey, 0, len(keys))
	for i, j := 0, len(ok)-1; i <= j; i, j = i+1, j-1 {
		out = append(out, ok[i])
		if i != j {
			out = append(out, ok[j])
		}
	}
	return append(out, bad...)
}

// probeCandidatesSQL lists up to $1 due candidates (CandidateSQL without
// locking: nothing is leased yet) with their attempts, in claim order. It
// walks the same rows a batch claim would, once per half-open.
var probeCandidatesSQL = `
SELECT cand.id, k.completer_attempts, cand.tracked_at
FROM (` + strings.Replace(CandidateSQL, CandidateLocking, "", 1) + `) cand
JOIN idempotency_keys k ON k.id = cand.id
ORDER BY cand.tracked_at, cand.id`

// claimOneSQL is claimSQL restricted to one key ($7, tracked under $8), so
// the probe is the key chooseProbes picked, leased under exactly the
// conditions of a batch claim (it is skipped if it stopped being due or
// another replica took it). The tracked created_at makes it one primary-key
// lookup in idemd_unfinished_keys, not a walk of the backlog.
var claimOneSQL = strings.Replace(claimSQL, "ORDER BY u.created_at, u.key_id",
	"AND u.key_id = $7 AND u.created_at = $8::timestamptz AND c.id = $7\n    ORDER BY u.created_at, u.key_id", 1)

// probeCandidate is a due key that could be the half-open probe.
type probeCandidate struct {
	ID        int64
	Attempts  int
	TrackedAt time.Time
}

// chooseProbes orders candidates (given in claim order) by how much a
// probe on them says about the API: first keys that are not suspect (a
// suspect key already failed while the API answered others, so its failure
// says nothing), then fewest attempts, then the newest first (the front of
// the claim order is where keys that keep failing accumulate, see
// dispatchOrder). Without this the probe was always the oldest due key, and
// a key the API can never finish kept the breaker open for everyone.
func chooseProbes(cands []probeCandidate, suspect func(id int64, attempts int) bool) []int64 {
	type ranked struct {
		probeCandidate
		suspect bool
		pos     int
	}
	rs := make([]ranked, len(cands))
	for i, c := range cands {
		rs[i] = ranked{c, suspect(c.ID, c.Attempts), i}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		if a.suspect != b.suspect {
			if a.suspect {
				return 1
			}
			return -1
		}
		if a.Attempts != b.Attempts {
			return a.Attempts - b.Attempts
		}
		return b.pos - a.pos
	})
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// claimProbe leases the one key the half-open breaker probes with: the best
// of the first BatchSize due candidates by chooseProbes. If that key was
// taken meanwhile it tries the next; it claims nothing only when no
// candidate is left.
func (s *Service) claimProbe(ctx context.Context) ([]claimedKey, error) {
	rows, err := s.pool.Query(ctx, probeCandidatesSQL, s.cfg.BatchSize, s.cfg.Grace, s.cfg.Idle, s.cfg.LockTimeout)
	if err != nil {
		return nil, fmt.Errorf("completer: probe candidates: %w", err)
	}
	cands, err := pgx.CollectRows(rows, pgx.RowToStructByPos[probeCandidate])
	if err != nil {
		return nil, fmt.Errorf("completer: probe candidates: %w", err)
	}
	tracked := make(map[int64]time.Time, len(cands))
	for _, c := range cands {
		tracked[c.ID] = c.TrackedAt
	}
	for _, id := range chooseProbes(cands, s.breaker.Suspect) {
		keys, err := s.claimWith(ctx, claimOneSQL, 1, id, tracked[id])
		if err != nil || len(keys) > 0 {
			return keys, err
		}
	}
	return nil, nil
}

// reply is what the API answered.
type reply struct {
	status int   // 0 when err != nil
	err    error // transport error or timeout
}

// process drives one leased key and returns its outcome.
func (s *Service) process(ctx context.Context, k claimedKey, leaseDeadline time.Time) Outcome {
	log := s.log.With(zap.Int64("key_id", k.ID), zap.Int64("user_id", k.UserID))
	if k.PastHorizon {
		return s.giveUp(ctx, log, k, k.Attempts, fmt.Sprintf("past the give-up horizon of %s after creation", s.cfg.GiveUpAfter), "")
	}
	if !s.breaker.Allow() {
		return s.release(ctx, log, k)
	}
	if err := s.waitRate(ctx); err != nil {
		s.breaker.Cancel()
		return s.release(ctx, log, k)
	}
	if time.Until(leaseDeadline) < s.cfg.RequestTimeout+leaseMargin {
		// Not enough lease left for a full request: hand the key back
		// rather than risk another replica claiming it mid-request.
		s.breaker.Cancel()
		return s.release(ctx, log, k)
	}

	start := time.Now()
	rep := s.send(ctx, k)
	s.metrics.duration.Observe(time.Since(start).Seconds())

	// Writes after the request must happen even when shutdown cancelled
	// it: the request may have reached the API.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st, err := s.reread(wctx, k)
	if err != nil {
		s.breaker.Cancel()
		log.Error("re-read after replay failed; the lease will expire", zap.Error(err))
		return OutcomeLeaseLost
	}
	switch {
	case !st.exists:
		s.breaker.Succeeded(k.ID)
		s.breaker.Forget(k.ID)
		if _, err := s.pool.Exec(wctx, untrackSQL, k.ID, k.TrackedAt); err != nil {
			log.Warn("untracking a deleted key failed (harmless: the next prune removes it)", zap.Error(err))
		}
		return OutcomeGone
	case st.finished:
		// The database is the truth: finished whatever status came back
		// (a stored 402 or even a stored 500 is a final answer).
		s.breaker.Succeeded(k.ID)
		return s.markFinished(wctx, log, k)
	case !st.leaseOurs:
		s.breaker.Cancel()
		log.Warn("lease lost during replay")
		return OutcomeLeaseLost
	}

	if rep.err != nil && ctx.Err() != nil {
		// Shutting down: the request was aborted by us, not failed.
		s.breaker.Cancel()
		return s.release(wctx, log, k)
	}
	switch {
	case rep.err != nil:
		s.breakerFailed(log, k)
		return s.fail(wctx, log, k, st, OutcomeRetry, "request failed: "+describeErr(rep.err))
	case rep.status == http.StatusConflict:
		s.breaker.Succeeded(k.ID)
		return s.inProgress(wctx, log, k)
	case rep.status >= 500 || rep.status == http.StatusTooManyRequests:
		s.breakerFailed(log, k)
		return s.fail(wctx, log, k, st, OutcomeRetry, fmt.Sprintf("API answered %d %s", rep.status, http.StatusText(rep.status)))
	case rep.status == http.StatusUnauthorized || rep.status == http.StatusForbidden:
		// A misconfigured secret looks like this on every key: count it
		// against the breaker so attempts burn slowly while an operator
		// fixes it. (With a wrong secret no key ever succeeds, so none of
		// these is taken for a key's own failure.)
		s.breakerFailed(log, k)
		return s.fail(wctx, log, k, st, OutcomeUnauthorized, fmt.Sprintf(
			"API answered %d %s to the signed replay of an unfinished key: the completer's --auth-secret-file does not match the API's replay secret, or the API does not accept replays on %s",
			rep.status, http.StatusText(rep.status), k.Path))
	default:
		// The API answered deliberately: it is up, whatever this key's
		// problem is.
		s.breaker.Succeeded(k.ID)
		return s.fail(wctx, log, k, st, OutcomeRejected, fmt.Sprintf("API answered %d %s but the key is still at recovery point %q", rep.status, http.StatusText(rep.status), st.recoveryPoint))
	}
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
	if s.onReserve != nil && r.OK() {
		s.onReserve(now.Add(d))
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

func (s *Service) send(ctx context.Context, k claimedKey) reply {
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
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	return reply{status: resp.StatusCode}
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

type keyState struct {
	exists        bool
	finished      bool
	leaseOurs     bool
	pastHorizon   bool
	recoveryPoint string
}

func (s *Service) reread(ctx context.Context, k claimedKey) (keyState, error) {
	st := keyState{exists: true}
	err := s.pool.QueryRow(ctx, `
SELECT recovery_point, recovery_point = 'finished',
       completer_leased_until IS NOT DISTINCT FROM $2,
       created_at + $3::interval <= now()
FROM idempotency_keys WHERE id = $1`, k.ID, k.Lease, s.cfg.GiveUpAfter).
		Scan(&st.recoveryPoint, &st.finished, &st.leaseOurs, &st.pastHorizon)
	if errors.Is(err, pgx.ErrNoRows) {
		return keyState{}, nil
	}
	return st, err
}

// markFinished clears our bookkeeping on a finished key and stops tracking
// it.
func (s *Service) markFinished(ctx context.Context, log *zap.Logger, k claimedKey) Outcome {
	_, err := s.pool.Exec(ctx, `
WITH untracked AS (`+untrackSQL+`)
UPDATE idempotency_keys SET completer_leased_until = NULL, completer_next_attempt_at = NULL
WHERE id = $1 AND completer_leased_until = $3`, k.ID, k.TrackedAt, k.Lease)
	if err != nil {
		log.Warn("clearing the lease of a finished key failed (harmless: finished keys are never claimed)", zap.Error(err))
	}
	log.Debug("key finished")
	return OutcomeFinished
}

// release hands a key back without counting an attempt.
func (s *Service) release(ctx context.Context, log *zap.Logger, k claimedKey) Outcome {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := s.pool.Exec(wctx, `
UPDATE idempotency_keys SET completer_leased_until = NULL
WHERE id = $1 AND completer_leased_until = $2`, k.ID, k.Lease)
	if err != nil {
		log.Warn("releasing a lease failed; it will expire", zap.Error(err))
	}
	return OutcomeDeferred
}

func (s *Service) inProgress(ctx context.Context, log *zap.Logger, k claimedKey) Outcome {
	tag, err := s.pool.Exec(ctx, `
UPDATE idempotency_keys
SET completer_leased_until = NULL, completer_next_attempt_at = now() + $3::interval
WHERE id = $1 AND completer_leased_until = $2 AND recovery_point <> 'finished'`,
		k.ID, k.Lease, s.cfg.InProgressDelay)
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

// fail records a failed attempt: retry later with backoff, or give up when
// attempts or the horizon are exhausted.
func (s *Service) fail(ctx context.Context, log *zap.Logger, k claimedKey, st keyState, o Outcome, msg string) Outcome {
	attempts := k.Attempts + 1
	if attempts >= s.cfg.MaxAttempts {
		return s.giveUp(ctx, log, k, attempts, fmt.Sprintf("%d failed attempts (--max-attempts %d)", attempts, s.cfg.MaxAttempts), msg)
	}
	if st.pastHorizon {
		return s.giveUp(ctx, log, k, attempts, fmt.Sprintf("past the give-up horizon of %s after creation", s.cfg.GiveUpAfter), msg)
	}
	delay := Backoff(attempts, s.cfg.BackoffBase, s.cfg.BackoffMax, s.jitter)
	// The next attempt is never later than the horizon, so giving up is
	// not delayed by a long backoff.
	tag, err := s.pool.Exec(ctx, `
UPDATE idempotency_keys
SET completer_attempts = $3,
    completer_last_error = $4,
    completer_next_attempt_at = LEAST(now() + $5::interval, created_at + $6::interval),
    completer_leased_until = NULL
WHERE id = $1 AND completer_leased_until = $2 AND recovery_point <> 'finished'`,
		k.ID, k.Lease, attempts, msg, delay, s.cfg.GiveUpAfter)
	if err != nil {
		log.Error("recording a failed attempt failed; the lease will expire", zap.Error(err))
		return OutcomeLeaseLost
	}
	if tag.RowsAffected() == 0 {
		return OutcomeLeaseLost
	}
	lvl := zap.InfoLevel
	if o == OutcomeUnauthorized {
		lvl = zap.ErrorLevel
	}
	log.Log(lvl, "replay failed, will retry", zap.String("outcome", string(o)), zap.Int("attempts", attempts),
		zap.Duration("retry_in", delay), zap.String("error", msg))
	return o
}

// giveUp sets completer_gave_up_at and flags the key for review in one
// transaction, only if we still hold the lease and the key is unfinished.
func (s *Service) giveUp(ctx context.Context, log *zap.Logger, k claimedKey, attempts int, why, lastErr string) Outcome {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	detail := "completer gave up: " + why
	if lastErr != "" {
		detail += "; last error: " + lastErr
	}
	var outcome Outcome
	err := pgx.BeginFunc(wctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(wctx, `
UPDATE idempotency_keys
SET completer_gave_up_at = now(), completer_leased_until = NULL, completer_attempts = $3,
    completer_last_error = COALESCE(NULLIF($4, ''), completer_last_error)
WHERE id = $1 AND completer_leased_until = $2 AND recovery_point <> 'finished' AND completer_gave_up_at IS NULL`,
			k.ID, k.Lease, attempts, lastErr)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			outcome = OutcomeLeaseLost
			return nil
		}
		if _, err := tx.Exec(wctx, untrackSQL, k.ID, k.TrackedAt); err != nil {
			return err
		}
		if _, err := review.Flag(wctx, tx, k.ID, review.ReasonCompleterGaveUp, detail, FlaggedBy); err != nil {
			return err
		}
		outcome = OutcomeGaveUp
		return nil
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

// maybePrune runs Prune at most once per poll interval.
func (s *Service) maybePrune(ctx context.Context) {
	s.mu.Lock()
	if time.Since(s.lastPrune) < s.cfg.PollInterval {
		s.mu.Unlock()
		return
	}
	s.lastPrune = time.Now()
	s.mu.Unlock()
	if n, err := s.Prune(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("pruning idemd_unfinished_keys failed", zap.Error(err))
	} else if n > 0 {
		s.log.Debug("pruned idemd_unfinished_keys", zap.Int("deleted", n))
	}
}

// Prune deletes the idemd_unfinished_keys rows of keys that are finished,
// given up or gone, and returns how many it deleted. The trigger records
// every key inserted unfinished, and the API finishes most of them itself
// without the completer seeing them; Prune (once per poll interval) keeps
// the table about the size of the backlog plus the keys inserted since the
// last prune, so the candidate walk, which stops at the grace period, sees
// the backlog alone. It walks the table in bounded statements
// (pruneBatch rows each).
func (s *Service) Prune(ctx context.Context) (int, error) {
	cursorAt, cursorID := time.Time{}, int64(math.MinInt64)
	deleted := 0
	for {
		var walked, pruned int
		if err := s.pool.QueryRow(ctx, pruneSQL, cursorAt, cursorID, pruneBatch).Scan(&walked, &pruned, &cursorAt, &cursorID); err != nil {
			return deleted, fmt.Errorf("completer: prune: %w", err)
		}
		deleted += pruned
		if walked < pruneBatch {
			return deleted, nil
		}
	}
}

// Backoff is the delay before retry number attempt (1 = after the first
// failure): full jitter, uniform in [0, min(max, base·2^(attempt-1))).
// jitter(n) must return a uniform value in [0, n).
func Backoff(attempt int, base, max time.Duration, jitter func(n int64) int64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	ceil := base
	for i := 1; i < attempt && ceil < max; i++ {
		ceil *= 2
	}
	if ceil > max {
		ceil = max
	}
	if ceil <= 0 {
		return 0
	}
	return time.Duration(jitter(int64(ceil)))
}

// maybeRefreshGauges updates the backlog gauges at most once per poll
// interval unless forced.
func (s *Service) maybeRefreshGauges(ctx context.Context, force bool) {
	s.mu.Lock()
	if !force && time.Since(s.lastGauges) < s.cfg.PollInterval {
		s.mu.Unlock()
		return
	}
	s.lastGauges = time.Now()
	s.mu.Unlock()
	if err := s.RefreshGauges(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("refreshing backlog gauges failed", zap.Error(err))
	}
}

// RefreshGauges recomputes keys pending by recovery point and the oldest
// unfinished key's age (both walk only idemd_unfinished_keys), and
// the open reviews by reason and the oldest one's age (the partial index of
// open reviews). Both review reasons are always exported, at 0 when none is
// open, so an alert on them never sees an absent series.
func (s *Service) RefreshGauges(ctx context.Context) error {
	if err := refreshGroupGauges(ctx, s.pool, pendingKeysSQL, s.metrics.pending, s.metrics.oldestAge); err != nil {
		return fmt.Errorf("pending keys: %w", err)
	}
	if err := refreshGroupGauges(ctx, s.pool, openReviewsSQL, s.metrics.openReviews, s.metrics.oldestReview,
		review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp); err != nil {
		return fmt.Errorf("open reviews: %w", err)
	}
	return nil
}

// The gauge queries: one row per label value with its count and the age in
// seconds of its oldest row, by the database clock.
const (
	pendingKeysSQL = `
SELECT k.recovery_point, count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(k.created_at)), 0)::float8
FROM idemd_unfinished_keys u
JOIN idempotency_keys k ON k.id = u.key_id
WHERE k.recovery_point <> 'finished' AND k.completer_gave_up_at IS NULL
GROUP BY k.recovery_point`
	openReviewsSQL = `
SELECT reason, count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(flagged_at)), 0)::float8
FROM idempotency_key_reviews
WHERE resolved_at IS NULL
GROUP BY reason`
)

// refreshGroupGauges sets counts from sql's (label, count, age) rows, and
// oldest to the greatest age (0 when there are no rows). Label values that
// are gone are dropped, except always, which stay at 0.
func refreshGroupGauges(ctx context.Context, pool *pgxpool.Pool, sql string, counts *prometheus.GaugeVec, oldest prometheus.Gauge, always ...string) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	counts.Reset()
	for _, l := range always {
		counts.WithLabelValues(l).Set(0)
	}
	maxAge := 0.0
	for rows.Next() {
		var label string
		var n int64
		var age float64
		if err := rows.Scan(&label, &n, &age); err != nil {
			return err
		}
		counts.WithLabelValues(label).Set(float64(n))
		maxAge = max(maxAge, age)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	oldest.Set(maxAge)
	return nil
}

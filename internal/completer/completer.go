// Package completer drives abandoned idempotency keys to finished: it finds
// keys whose client gave up, leases a batch of them in the row (so replicas
// never replay one key at once) and replays each stored request against the
// API through the signed internal path (idem/replayauth). It never makes a
// side effect itself: the API owns the atomic phases; every write the
// completer does checks the state it expects (its own lease).
//
// The shape is docs/architecture.md's: New(Config) fills in a
// lifecycle.Skeleton with the completer's pass (claim and process batches
// until nothing is due right now) and when the next is due; Service embeds the
// skeleton, so Start, Stop and RunOnce (--once, and what tests call) are
// the skeleton's own. The
// decisions are pure functions beside the
// I/O: the outcome of a replay (outcome.go), the circuit breaker
// (breaker.go), the adaptive limit on replays in flight (congestion.go),
// when a pass ends and when the next is due (this file).
package completer

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lifecycle/testsignal"
)

// FlaggedBy is recorded in idempotency_key_reviews.flagged_by.
const FlaggedBy = "completer"

// maxPassRetry caps the delay after failed passes (the database is
// unreachable, or did not answer): backoff.Delay from --poll-interval up
// to this, or to --poll-interval when that is longer. A failed pass costs
// the database one call, so one every 30 s is nothing to a database that
// is down, and the completer claims again within 30 s of an outage's end
// (a minute kept it idle for most of a minute after a silent fault had
// ended).
const maxPassRetry = 30 * time.Second

// Result is what one pass (or one batch of it) did.
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
	// BreakerOpen: the pass ended because the breaker is open (its last
	// batch claimed nothing).
	BreakerOpen bool
	// Probe: the breaker was half-open and a batch claimed one probe.
	Probe bool
}

func (r *Result) count(o Outcome) {
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

// add accumulates a batch into a pass's totals.
func (r *Result) add(b *Result) {
	r.Claimed += b.Claimed
	r.Finished += b.Finished
	r.InProgress += b.InProgress
	r.Retried += b.Retried
	r.Unauthorized += b.Unauthorized
	r.Rejected += b.Rejected
	r.GaveUp += b.GaveUp
	r.Deferred += b.Deferred
	r.LeaseLost += b.LeaseLost
	r.Gone += b.Gone
	r.BreakerOpen = r.BreakerOpen || b.BreakerOpen
	r.Probe = r.Probe || b.Probe
}

// fields are r as log fields.
// worthALine says whether a pass's summary line is worth logging: a pass
// that claimed nothing logs none (a --once run logs it anyway).
func (r *Result) worthALine() bool { return r.Claimed > 0 }

func (r *Result) fields() []zap.Field {
	return []zap.Field{
		zap.Int("claimed", r.Claimed), zap.Int("finished", r.Finished),
		zap.Int("in_progress", r.InProgress), zap.Int("retried", r.Retried),
		zap.Int("unauthorized", r.Unauthorized), zap.Int("rejected", r.Rejected),
		zap.Int("gave_up", r.GaveUp), zap.Int("deferred", r.Deferred),
		zap.Int("lease_lost", r.LeaseLost), zap.Int("gone", r.Gone), zap.Bool("breaker_open", r.BreakerOpen),
	}
}

// Service is the completer.
type Service struct {
	// Skeleton gives the Service its Start (a pass at once, then one per
	// --poll-interval, sooner when the breaker's cool-down ends first; a
	// backoff after a failed pass), Stop (stop claiming, let the current
	// batch finish until ctx's deadline, then abort what is left: those
	// keys are released or their leases expire) and RunOnce (--once: claim
	// and process batches until no key is due or the breaker is open; when
	// ctx ends replays in flight are aborted and their keys released; the
	// Result is never nil, even with an error).
	lifecycle.Skeleton[*Result]

	cfg     Config
	pool    *pgxpool.Pool
	calls   *dbcall.Bounds // every database call's bound
	log     *zap.Logger
	client  *http.Client
	base    *url.URL
	limiter *rate.Limiter
	breaker *breaker
	metrics *metrics
	// conc limits replays in flight (congestion.go).
	conc *gate

	// Test seams: the limiter's and the breaker's clock, the retry
	// backoff's randomness.
	now     func() time.Time
	jitter  func(n int64) int64 // uniform in [0, n)
	hooks   testHooks
	signals testSignals

	rateMu sync.Mutex

	walk walker // the low-water mark of the walks (mark.go)

	// retries are the times the failed attempts of this process fall due
	// again: the next pass is due at the first of them when that comes
	// before --poll-interval.
	retries retrySchedule

	mu        sync.Mutex
	lastPrune time.Time
}

// testSignals tell tests that the completer reached a point; tests only
// wait on them (internal/lifecycle/testsignal). Free in production.
type testSignals struct {
	breakerOpened testsignal.Signal[struct{}] // the breaker opened (or re-opened)
}

// testHooks are where a test must see every value, which a signal (it
// drops what its buffer cannot hold) cannot promise: the rate tests check
// every pair of the limiter's reservations. nil in production.
type testHooks struct {
	reserved func(at time.Time) // a rate-limited request may go at at
}

// New validates cfg and builds a Service. A bad configuration returns a
// *config.Error listing every problem.
func New(cfg Config) (*Service, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	base, _ := url.Parse(strings.TrimRight(cfg.APIURL, "/"))
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
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:     cfg,
		pool:    cfg.Pool,
		calls:   cfg.Calls,
		log:     cfg.Logger,
		client:  client,
		base:    base,
		limiter: rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst),
		metrics: m,
		now:     time.Now,
		jitter:  rand.Int64N,
	}
	s.Skeleton = lifecycle.Skeleton[*Result]{
		Name:   "completer",
		Logger: cfg.Logger,
		Ready:  cfg.Ready,
		// A pass is due every --poll-interval and may hold a claim for
		// its lease, so one older than three intervals and two leases
		// means a stuck loop.
		MaxPassAge: func() time.Duration { return 3*cfg.PollInterval + 2*cfg.Lease },
		Pass:       s.pass,
		Next: func(last *Result) time.Duration {
			retryLeft, retry := s.retries.next(s.now())
			return nextPass(last, cfg.PollInterval, s.breaker.Remaining(), retryLeft, retry)
		},
		Beside:        func() []lifecycle.Loop { return []lifecycle.Loop{s.gaugesLoop()} },
		Retry:         passRetry(cfg.PollInterval),
		Summary:       "completer pass",
		QuietTimeouts: true,
		SummaryLevel:  zap.InfoLevel,
		// A pass that claimed nothing logs no line.
		Summarize: func(last *Result, _ error) ([]zap.Field, bool) { return last.fields(), last.worthALine() },
	}
	s.breaker = newBreaker(func() time.Time { return s.now() }, cfg.BreakerFailures, cfg.BreakerCooldown, cfg.BreakerMaxCooldown, s.breakerChanged)
	s.conc = newGate(newAIMD(cfg.Concurrency, true))
	m.concurrencyLimit.Set(float64(cfg.Concurrency))
	return s, nil
}

// concurrencyChanged publishes a change of the adaptive limit and logs
// the start and the end of a backoff episode (not every step of one).
func (s *Service) concurrencyChanged(ch limitChange) {
	if !ch.changed() {
		return
	}
	s.metrics.concurrencyLimit.Set(float64(ch.to))
	switch {
	case ch.backedOff:
		s.log.Info("replays conflict in the API (409 on keys no request holds): lowering replay concurrency until they clear",
			zap.Int("from", ch.from), zap.Int("to", ch.to), zap.Int("max", s.cfg.Concurrency))
	case ch.recovered:
		s.log.Info("replay conflicts cleared: replay concurrency back at --concurrency",
			zap.Int("concurrency", ch.to), zap.Duration("after", ch.episode))
	}
}

func (s *Service) breakerChanged(from, to BreakerState) {
	s.metrics.breakerState.Set(float64(to))
	if to == BreakerOpen {
		s.metrics.breakerOpens.Inc()
		s.signals.breakerOpened.Signal(struct{}{})
	}
	s.log.Info("circuit breaker state changed", zap.Stringer("from", from), zap.Stringer("to", to))
}

// pass is one pass: prune idemd_unfinished_keys (at most once per poll
// interval) and read the low-water mark the walks start at (startWalks,
// mark.go; a one-shot pass reads it from the start of the index: it has
// no earlier pass to trust), then run batches until passGoesOn says the
// pass is done or a stop is requested (checked between batches). ctx
// ending aborts the batch in progress.
func (s *Service) pass(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
	res := &Result{}
	_, err := s.startWalks(ctx, stop.OneShot())
	if err == nil {
		err = s.runBatches(ctx, stop, res)
	}
	return res, err
}

func (s *Service) runBatches(ctx context.Context, stop lifecycle.Stop, res *Result) error {
	for !stop.Requested() {
		b, err := s.runBatch(ctx)
		res.add(b)
		if err != nil {
			return err
		}
		// Draining a backlog at --rate can take longer than /readyz
		// allows a pass.
		s.MarkReady(time.Now())
		if !passGoesOn(b, s.cfg.BatchSize, s.breaker.State() == BreakerOpen) {
			return nil
		}
	}
	return nil
}

// passGoesOn decides, after batch b, whether the pass claims another
// batch. The pass is drained when a claim took fewer keys than it could
// (everything due at that moment was claimed; keys that fell due since,
// retries among them, wait for the next pass) or handed every key back
// unreplayed. It ends at once when the breaker is open (nothing may be
// claimed until Next's delay), and goes on after a probe that left the
// breaker closed or half-open (breakerOpen false): the API is back, so
// the backlog drains at --rate rather than a batch per poll interval.
func passGoesOn(b *Result, batchSize int, breakerOpen bool) bool {
	switch {
	case b.BreakerOpen:
		return false
	case b.Probe && b.Claimed > 0 && !breakerOpen:
		return true
	case b.Claimed < batchSize:
		return false
	case b.Deferred == b.Claimed:
		return false
	}
	return true
}

// passRetry is the backoff after failed passes (the database is
// unreachable): from --poll-interval up to maxPassRetry, or to
// --poll-interval when that is longer.
func passRetry(pollInterval time.Duration) lifecycle.Retry {
	return lifecycle.Retry{Base: pollInterval, Max: max(pollInterval, maxPassRetry)}
}

// nextPass is how long the loop waits after a successful pass:
// --poll-interval, or the breaker's remaining cool-down (breakerLeft) when
// the pass ended on an open breaker and it ends sooner, or, with the
// breaker closed, until a retry this process scheduled falls due (retry:
// there is one; retryLeft: in how long, 0 when it fell due during the
// pass) plus retryWakeMargin when that is sooner.
func nextPass(last *Result, pollInterval, breakerLeft, retryLeft time.Duration, retry bool) time.Duration {
	wait := pollInterval
	if last != nil && last.BreakerOpen {
		if breakerLeft > 0 && breakerLeft < wait {
			wait = breakerLeft
		}
		return wait
	}
	if retry && retryLeft+retryWakeMargin < wait {
		wait = retryLeft + retryWakeMargin
	}
	return wait
}

// retryWakeMargin is added to a retry's due time before the pass that
// picks it up: the database's clock decides whether it is due, and a pass
// a little early finds nothing and waits a whole --poll-interval.
const retryWakeMargin = 50 * time.Millisecond

// retrySchedule holds when the retries this process scheduled fall due.
type retrySchedule struct {
	mu  sync.Mutex
	due []time.Time
}

// add records a retry due at at.
func (r *retrySchedule) add(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.due = append(r.due, at)
}

// next returns how long until the first retry falls due and true, or
// false when there is none. Retries already due (they fell due while a
// pass ran, after its claims) make it 0 and are dropped: the pass it asks
// for at once picks them all up.
func (r *retrySchedule) next(now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	kept := r.due[:0]
	dueNow := false
	for _, at := range r.due {
		if !at.After(now) {
			dueNow = true
			continue
		}
		kept = append(kept, at)
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	r.due = kept
	switch {
	case dueNow:
		return 0, true
	case first.IsZero():
		return 0, false
	}
	return first.Sub(now), true
}

// runBatch claims one batch (one probe when the breaker is half-open,
// nothing when it is open) and processes it with bounded concurrency. The
// Result is never nil.
func (s *Service) runBatch(ctx context.Context) (*Result, error) {
	res := &Result{}
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
	for range min(s.cfg.Concurrency, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				o := s.process(ctx, k, leaseDeadline)
				s.metrics.replays.WithLabelValues(string(o)).Inc()
				mu.Lock()
				res.count(o)
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

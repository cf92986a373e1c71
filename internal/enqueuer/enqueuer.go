// Package enqueuer moves transactionally staged jobs from staged_jobs into
// River, exactly once.
//
// Each batch is one transaction: take up to BatchSize committed rows in id
// order from a starting id with FOR UPDATE SKIP LOCKED (deleting them and
// returning them in the same statement), insert the valid ones into River
// through an insert-only River client on the same transaction (COPY for a
// large batch, one INSERT for a small one), move the invalid ones to
// staged_jobs_dead with a reason, commit
// (batch.go). A row is therefore either still staged or (a River job xor a
// dead row) — never both, never neither, whatever process dies or
// connection drops. There is no high-water mark: a row whose transaction
// commits late, with an id lower than rows already moved, is found by a
// later drain that starts at or below it (see floor.go for where drains
// start and why that finds every row).
//
// The shape is docs/architecture.md's: New(Config), Start/Stop through a
// lifecycle.Runner running a lifecycle.Loop whose Pass is one pass (drain
// from wherever the floor says rows are, until it says nothing more is
// due; runOnce, RunOnce for --once), returning a Result that tests call
// directly. The loop is woken by LISTEN idemd_staged_jobs (a
// statement-level trigger on staged_jobs sends it at commit, with the
// lowest id the statement inserted; listen.go) on the one replica that
// is the drainer (the others stand by; drainer.go) and by the sweep, which
// every PollInterval looks for rows no notification told it about
// (sweep.go); both run beside the loop under the same Runner, with the
// backlog gauges (backlog.go). The decisions are pure functions beside the
// I/O: where a drain starts and the sweep's low-water mark (floor.go),
// whether a staged row can become a River job (validate.go), when the next
// pass is due (this file).
package enqueuer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/testsignal"
)

// NotifyChannel is the channel the staged_jobs trigger notifies.
const NotifyChannel = "idemd_staged_jobs"

// retryBase and retryMax bound backoff.Delay after a failed pass and
// between the listener's reconnect attempts: the delay's ceiling is 200 ms
// after the first failure and doubles per failure up to 10 s (the ceilings
// of the enqueuer's former retry rule).
const (
	retryBase = 200 * time.Millisecond
	retryMax  = 10 * time.Second
)

// Result is what one pass (or one drain of it) did. Counts are of
// committed batches: a batch that failed moved nothing.
type Result struct {
	Batches      int
	Moved        int // rows that became River jobs
	DeadLettered int // rows moved to staged_jobs_dead
}

// taken is how many staged rows the committed batches took.
func (r *Result) taken() int { return r.Moved + r.DeadLettered }

// add accumulates a drain into a pass's totals.
func (r *Result) add(d *Result) {
	r.Batches += d.Batches
	r.Moved += d.Moved
	r.DeadLettered += d.DeadLettered
}

// addBatch accumulates a committed batch.
func (r *Result) addBatch(b *batchResult) {
	r.Batches++
	r.Moved += b.moved
	r.DeadLettered += b.deadLettered
}

// fields are r as log fields.
func (r *Result) fields() []zap.Field {
	return []zap.Field{zap.Int("moved", r.Moved), zap.Int("dead_lettered", r.DeadLettered), zap.Int("batches", r.Batches)}
}

// Service is the enqueuer.
type Service struct {
	cfg       Config
	pool      *pgxpool.Pool
	listenCfg *pgx.ConnConfig // the listener's connection (config.go)
	river     *river.Client[pgx.Tx]
	valid     validator
	logger    *zap.Logger
	metrics   *metrics

	// wake is a pending wake-up of the loop (Loop.Wake); buffered 1.
	wake chan struct{}
	// wakeHeld: signals before this instant leave wake alone, so the loop
	// waits out a failed pass's backoff; the retry's pass takes the floor
	// they lowered.
	wakeMu   sync.Mutex
	wakeHeld time.Time
	// floor is where the next drain starts (floor.go).
	floor *floor
	// lw is the sweep's low-water mark (sweep.go).
	lw lowWater
	// passed is the highest id this replica has taken.
	passed atomic.Int64
	// listening is true while notifications are known to arrive (the
	// listener_up gauge): this replica is the drainer (drainer.go).
	listening atomic.Bool
	// gapLogged logs each notification gap reason once.
	gapLogged [2]sync.Once
	// gate is the drainer's session for the polling lock; polling is true
	// while the drainer polls instead of being notified (poll.go).
	gate             gate
	polling          atomic.Bool
	markWanted       atomic.Bool // the drainer would poll once the sweep has a low-water mark
	pollingErrLogged sync.Once

	runner lifecycle.Runner
	// instance tells this replica's listener self-checks from others'.
	instance string

	hooks   testHooks
	signals testSignals
}

// testSignals tell tests that the enqueuer reached a point; tests only
// wait on them (internal/testsignal). Free in production.
type testSignals struct {
	listenerUp          testsignal.Signal[struct{}] // the listener is the drainer and its first self-check came back: notifications arrive and wake it
	listenerChecked     testsignal.Signal[int]      // a self-check came back (its sequence number on this connection)
	listenerCheckFailed testsignal.Signal[error]    // a self-check did not come back in time
	passed              testsignal.Signal[struct{}] // the loop's pass ended (the first is the start's full pass)
	standby             testsignal.Signal[struct{}] // the listener stands by, waiting for the drainer lock
	swept               testsignal.Signal[bool]     // a sweep ended; true when it began with the listener up
	polling             testsignal.Signal[bool]     // the drainer started (true) or stopped (false) polling; false once the handoff's drain ended
}

// testHooks are where a test must act inside the service or see every
// value at a point of its choosing, which a signal (read once, in order,
// dropping what its buffer cannot hold) cannot give. nil in production.
type testHooks struct {
	// drainStarted sees every drain's spec before it starts: tests look
	// at the drains after a given moment (those a notification caused).
	drainStarted func(drainSpec)
	// dropNotification, when it returns true, loses a staged_jobs
	// notification: the listener asks the test which one.
	dropNotification func(payload string) bool
	// sweepMarkOnly keeps the sweep to moving the low-water mark: the rows
	// it finds wake nothing, so only notifications and polls move rows.
	sweepMarkOnly bool
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
	listenCfg, err := cfg.listenConfig()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	// An insert-only River client: no queues, no workers. It validates and
	// encodes jobs exactly as any River client would (insertMany).
	rc, err := river.NewClient(riverpgxv5.New(cfg.Pool), &river.Config{Logger: nil})
	if err != nil {
		return nil, fmt.Errorf("enqueuer: river client: %w", err)
	}
	s := &Service{
		cfg:       cfg,
		pool:      cfg.Pool,
		listenCfg: listenCfg,
		river:     rc,
		valid:     newValidator(cfg.AllowedKinds, cfg.MaxArgsBytes),
		logger:    cfg.Logger,
		metrics:   m,
		wake:      make(chan struct{}, 1),
		floor:     newFloor(),
		runner:    lifecycle.Runner{Name: "enqueuer"},
		instance:  lease.Holder("enqueuer"),
	}
	s.lw.mark.Store(fullPass)
	s.passed.Store(fullPass)
	return s, nil
}

// Start runs the enqueuer in the background until Stop or until ctx ends:
// a full pass at once, then a pass whenever a notification or the sweep
// wakes the loop, and every --poll-interval (backoff.Delay after a failed
// pass, then a full pass). The listener, the sweep and the backlog gauges
// run beside the loop. Either stop request lets the current batch commit.
func (s *Service) Start(ctx context.Context) error {
	// Readiness is set up before the loop can first mark a pass.
	if s.cfg.Ready != nil {
		s.cfg.Ready.MarkStarted(time.Now())
		s.cfg.Ready.MaxPassAge = max(3*s.cfg.PollInterval, 30*time.Second)
	}
	return s.runner.Start(ctx, s.run)
}

// Stop lets the current batch finish and stops; if ctx ends first, the
// batch is abandoned (its transaction rolls back: nothing is lost). It
// returns when nothing of the enqueuer runs any more.
func (s *Service) Stop(ctx context.Context) error {
	return s.runner.Stop(ctx)
}

// run is the Runner's work: the drain loop, with the listener, the sweep
// and the stats loop beside it. Those have nothing to finish, so they are
// cancelled as soon as the drain loop has let its batch commit.
func (s *Service) run(ctx context.Context, stop <-chan struct{}) {
	aux, cancelAux := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, f := range []func(context.Context){s.listen, s.sweepLoop, s.statsLoop} {
		wg.Go(func() { f(aux) })
	}
	defer wg.Wait()
	defer cancelAux()

	s.wakeMu.Lock()
	s.wakeHeld = time.Time{}
	s.wakeMu.Unlock()
	// The first pass is a full one: rows committed while no enqueuer ran
	// notified no one.
	s.floor.lower(fullPass)
	s.metrics.wakeups.WithLabelValues(wakeStart).Inc()

	var (
		last    *Result
		lastEnd time.Time
		poll    pollState
		handoff bool // the pass after a handoff: polling ends with it
	)
	defer func() {
		if poll.polling || handoff {
			s.setPolling(false)
		}
	}()
	lifecycle.Loop{
		Pass: func(ctx context.Context) error {
			switch {
			case poll.polling:
				s.pollFloor()
			case last != nil:
				s.coalesce(ctx, stop, last.taken(), lastEnd)
			}
			var err error
			last, err = s.pass(ctx, stop)
			lastEnd = time.Now()
			if handoff && err == nil {
				// The drain that saw the rows of every transaction that
				// skipped its notification is done.
				handoff = false
				s.setPolling(false)
			}
			if err == nil {
				handoff = s.steerPolling(ctx, &poll, last.taken(), lastEnd) || handoff
			}
			s.signals.passed.Signal(struct{}{})
			return err
		},
		Next: func(err error, failures int) time.Duration {
			d := nextPass(err, failures, s.cfg.PollInterval)
			switch {
			case err != nil:
				s.retryAfter(d)
			case poll.polling:
				d = poll.wait
			}
			return d
		},
		Wake: s.wake,
		// A pass that found nothing to drain read nothing from the
		// database and proves nothing; the sweep marks readiness when it
		// finds the table empty.
		Passed: func(t time.Time) {
			if last != nil && last.Batches > 0 {
				s.markReady(t)
			}
		},
	}.Run(ctx, stop)
}

// nextPass is how long the loop waits for a wake-up after a pass:
// --poll-interval (a pass then takes whatever the floor holds; the sweep
// beside the loop wakes it as soon as it finds rows), or after failed
// passes (failures in a row) backoff.Delay from retryBase up to retryMax.
func nextPass(err error, failures int, pollInterval time.Duration) time.Duration {
	if err != nil {
		return backoff.Delay(failures, retryBase, retryMax, nil)
	}
	return pollInterval
}

// retryAfter makes the pass after a failed one a full pass (the failed
// drain's rows may lie anywhere from its floor on) and holds wake-ups for
// the backoff d, so notifications do not turn the backoff into a hot loop
// of failing passes.
func (s *Service) retryAfter(d time.Duration) {
	s.floor.lower(fullPass)
	s.metrics.wakeups.WithLabelValues(wakeRetry).Inc()
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	s.wakeHeld = time.Now().Add(d)
	select {
	case <-s.wake:
	default:
	}
}

// trigger asks the loop for a full pass: a drain from the start of
// staged_jobs (the listener's reconnect).
func (s *Service) trigger(cause string) {
	s.floor.lower(fullPass)
	s.signal(cause)
}

// signal wakes the loop after the floor was lowered. Every signal is
// counted by its cause, including those coalesced into a wake-up that is
// already pending (which will see their rows too: the floor is taken when
// the wake-up is handled) and those held during a retry's backoff (the
// retry's pass takes the floor).
func (s *Service) signal(cause string) {
	s.metrics.wakeups.WithLabelValues(cause).Inc()
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if time.Now().Before(s.wakeHeld) {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// markReady tells /readyz the enqueuer is doing its job: after every
// committed batch (a drain of a large backlog must not look stale while it
// works), after a pass that drained, and after a sweep that found the
// table empty.
func (s *Service) markReady(t time.Time) {
	if s.cfg.Ready != nil {
		s.cfg.Ready.MarkPass(t)
	}
}

// RunOnce is --once: it drains staged_jobs until a full pass (batches
// from the start of the table until one comes back short) takes nothing.
// A pass moves past rows another transaction holds locked; the next takes
// those it has released meanwhile (a killed enqueuer's batch, rolled back
// once the server notices). When ctx ends (SIGTERM) the batch in progress
// rolls back whole. The Result is never nil, even with an error, so the
// committed batches are counted.
func (s *Service) RunOnce(ctx context.Context) (*Result, error) {
	return s.runOnce(ctx)
}

// runOnce is one pass of a service with no listener and no sweep beside
// it: nothing says where rows are, so everything staged is due, and it
// asks the floor for full passes until one takes nothing.
func (s *Service) runOnce(ctx context.Context) (*Result, error) {
	s.floor.lowerUntilEmpty()
	return s.pass(ctx, nil)
}

// pass is one pass: it takes the floor (where notifications, the sweep and
// full-pass requests say rows are) and drains from it, again while the
// floor asks for more, until it asks for nothing or stop is closed (Stop,
// or the end of Start's context; checked between batches, nil never is).
// ctx ending aborts the batch in progress. It logs one summary line when
// it moved something, and its failure. The Result is never nil.
func (s *Service) pass(ctx context.Context, stop <-chan struct{}) (*Result, error) {
	res := &Result{}
	for !stopped(stop) {
		spec, ok := s.floor.take(s.passed.Load())
		if !ok {
			// A drain that began after the last request covered it.
			break
		}
		d, err := s.drain(ctx, stop, spec)
		res.add(d)
		if err != nil {
			s.logger.Error("drain failed", append(res.fields(), zap.Int64("from_id", spec.from), zap.Error(err))...)
			return res, err
		}
		if spec.untilEmpty && d.taken() > 0 {
			s.floor.lowerUntilEmpty()
			continue
		}
		if endPass(s.cfg.WakeCoalesce, d.taken()) {
			break
		}
	}
	if res.taken() > 0 {
		s.logger.Debug("drained", res.fields()...)
	}
	return res, nil
}

// endPass reports whether a pass ends after a drain that took taken rows
// though the floor may ask for more. Under a stream of commits every drain
// finds a notification or two that arrived while it ran; draining them at
// once would chase each commit with a transaction of its own and never
// reach the wait in coalesce (at 1,000 commits a second: 1.8 rows per
// transaction). So a drain that took few rows ends the pass when
// coalescing is on; the wake-up those notifications left pending starts
// the next pass, which waits for company first. A drain behind a backlog
// goes on.
func endPass(window time.Duration, taken int) bool {
	return window > 0 && taken < coalesceRows
}

// drain runs batches from spec.from until one comes back short, or stop
// is closed. The first batch runs alone: in the steady state (a few rows
// per wake-up) it is the only one, and a second worker would only add an
// empty transaction competing for the same WAL flush. Only when it comes
// back full is there a backlog worth draining with every worker. The
// Result is never nil.
func (s *Service) drain(ctx context.Context, stop <-chan struct{}, spec drainSpec) (*Result, error) {
	if s.hooks.drainStarted != nil {
		s.hooks.drainStarted(spec)
	}
	total := &Result{}
	cur := &cursor{next: spec.from}
	b, err := s.runBatch(ctx, cur, spec)
	if err != nil {
		return total, err
	}
	total.addBatch(b)
	if !b.full || stopped(stop) {
		return total, nil
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range s.cfg.Workers {
		wg.Go(func() {
			res, err := s.drainWorker(ctx, stop, cur, spec)
			mu.Lock()
			defer mu.Unlock()
			total.add(res)
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return total, firstErr
}

// drainWorker moves batches until one comes back short.
func (s *Service) drainWorker(ctx context.Context, stop <-chan struct{}, cur *cursor, spec drainSpec) (*Result, error) {
	total := &Result{}
	for {
		b, err := s.runBatch(ctx, cur, spec)
		if err != nil {
			return total, err
		}
		total.addBatch(b)
		if !b.full || stopped(stop) {
			return total, nil
		}
	}
}

// stopped reports whether Stop has asked the pass to end after this batch.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

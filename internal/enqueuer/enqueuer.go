// Package enqueuer moves transactionally staged jobs from staged_jobs into
// River, exactly once.
//
// Each batch is one transaction: take up to BatchSize committed rows in id
// order from a starting id with FOR UPDATE SKIP LOCKED, delete them and
// write their River jobs, in one statement sent in one round trip
// (servermove.go); a batch holding a row that cannot be a valid job takes
// the Go path instead, which inserts the valid rows through an insert-only
// River client on the same transaction and moves the invalid ones to
// staged_jobs_dead with a reason (batch.go). A row is therefore either
// still staged or (a River job xor a dead row) — never both, never
// neither, whatever process dies or connection drops. There is no
// high-water mark: a row whose transaction commits late, with an id lower
// than rows already moved, is found by a later drain that starts at or
// below it (see floor.go for where drains start and why that finds every
// row).
//
// The shape is docs/architecture.md's: New(Config) fills in a
// lifecycle.Skeleton with the enqueuer's pass (drain from wherever the
// floor says rows are, until it says nothing more is due) and when the
// next is due; Service embeds the skeleton, so Start, Stop and RunOnce
// (--once, and what tests call) are the skeleton's own. The loop is woken by LISTEN idemd_staged_jobs (a
// statement-level trigger on staged_jobs sends it at commit, with the
// lowest id the statement inserted; listen.go) on the one replica that
// is the drainer (the others stand by; drainer.go) and by the sweep, which
// every SweepInterval looks for rows no notification told it about
// (sweep.go); both run beside the loop, with the backlog gauges
// (backlog.go). The decisions are pure functions beside the
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
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lifecycle/testsignal"
	"github.com/idemd/idemd/internal/riverdb"
)

// NotifyChannel is the channel the staged_jobs trigger notifies.
const NotifyChannel = "idemd_staged_jobs"

// passRetry is the backoff after a failed pass and between the
// listener's reconnect attempts: a staged row waits for the next pass, so
// the first retry comes within 200 ms, and a database that stays away is
// asked at most every 10 s.
var passRetry = lifecycle.Retry{Base: 200 * time.Millisecond, Max: 10 * time.Second}

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
	// Skeleton gives the Service its Start (a full pass at once, then a
	// pass whenever a notification or the sweep wakes the loop, and every
	// --sweep-interval; a backoff after a failed pass, then a full pass;
	// the listener, the sweep and the backlog gauges beside the loop),
	// Stop (the current batch commits; past ctx's end it is abandoned and
	// rolls back, nothing is lost) and RunOnce (--once: drain until a full
	// pass takes nothing; when ctx ends the batch in progress rolls back
	// whole; the Result is never nil, even with an error).
	lifecycle.Skeleton[*Result]

	cfg       Config
	pool      *pgxpool.Pool
	calls     *dbcall.Bounds  // every database call's bound
	listenCfg *pgx.ConnConfig // the listener's connection (config.go)
	// listenAuth is the pool's BeforeConnect (--database-password-file),
	// applied to the listener's connections too, so they authenticate with
	// a rotated password; nil without one.
	listenAuth func(context.Context, *pgx.ConnConfig) error
	river      *river.Client[pgx.Tx]
	valid      riverdb.Validator
	// riverGate is the River schema gate's last verdict (riverschema.go).
	riverGate riverGate
	// refusals is the refusal the last batch failed with (refusal.go).
	refusals refusalState
	// notices limits the insert notifications the server-side move sends
	// River's workers (servermove.go).
	notices insertNotices
	logger  *zap.Logger
	metrics *metrics

	// wake is a pending wake-up of the loop (Loop.Wake); buffered 1.
	wake chan struct{}
	// loop is the main loop's state across its passes, owned by it.
	loop loopState
	// floor is where the next drain starts (floor.go).
	floor *floor
	// lw is the sweep's low-water mark (sweep.go).
	lw lowWater
	// takenUpTo is the highest id this replica has taken.
	takenUpTo atomic.Int64
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

	// listenFailures counts the listener's failed connections since it
	// last heard (its loop logs the first of an outage as a warning).
	listenFailures int
	// instance tells this replica's listener self-checks from others'.
	instance string

	hooks   testHooks
	signals testSignals
}

// testSignals tell tests that the enqueuer reached a point; tests only
// wait on them (internal/lifecycle/testsignal). Free in production.
type testSignals struct {
	listenerUp          testsignal.Signal[struct{}] // the listener is the drainer and its first self-check came back: notifications arrive and wake it
	listenerChecked     testsignal.Signal[int]      // a self-check came back (its sequence number on this connection)
	listenerCheckFailed testsignal.Signal[error]    // a self-check did not come back in time
	passed              testsignal.Signal[struct{}] // the loop's pass ended (the first is the start's full pass)
	standby             testsignal.Signal[struct{}] // the listener stands by, trying for the drainer lock
	takeoverAttempt     testsignal.Signal[bool]     // a standby's attempt at the drainer lock returned (true: it took it)
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
	// drainStop sees every drain's stop: a test that must act only once
	// a stop is requested waits on its Done (a signal carries values, not
	// the moment a channel closes).
	drainStop func(lifecycle.Stop)
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
	// An insert-only River client for the Go path: no queues, no workers.
	// It validates and encodes jobs exactly as any River client would
	// (insertMany), and it is the reference the server-side move is tested
	// against.
	rc, err := river.NewClient[pgx.Tx](riverdb.NewDriver(cfg.Pool), &river.Config{Logger: nil})
	if err != nil {
		return nil, fmt.Errorf("enqueuer: river client: %w", err)
	}
	s := &Service{
		cfg:        cfg,
		pool:       cfg.Pool,
		calls:      cfg.Calls,
		listenCfg:  listenCfg,
		listenAuth: cfg.Pool.Config().BeforeConnect,
		river:      rc,
		valid:      riverdb.NewValidator(cfg.AllowedKinds, cfg.MaxArgsBytes),
		logger:     cfg.Logger,
		metrics:    m,
		wake:       make(chan struct{}, 1),
		floor:      newFloor(),
		instance:   lease.Holder("enqueuer"),
	}
	if cfg.Ready != nil {
		cfg.Ready.Blocked = s.blocked
	}
	s.lw.mark.Store(fullPass)
	s.takenUpTo.Store(fullPass)
	if cfg.PollOnly {
		s.metrics.pollOnly.Set(1)
	}
	s.Skeleton = lifecycle.Skeleton[*Result]{
		Name:       "enqueuer",
		Logger:     cfg.Logger,
		Ready:      cfg.Ready,
		MaxPassAge: func() time.Duration { return max(3*cfg.SweepInterval, 30*time.Second) },
		Pass:       s.pass,
		Next:       s.nextPass,
		Retry:      passRetry,
		Wake:       s.wake,
		Beside:     s.besideLoop,
		Finally:    s.loopStopped,
		// A pass that found nothing to drain read nothing from the
		// database and proves nothing; the sweep marks readiness when it
		// finds the table empty.
		ReadyAfter: func(last *Result) bool { return last.Batches > 0 },
		// Under a stream of commits a pass moves rows hundreds of times
		// a second: its line is for debugging.
		Summary:       "enqueuer pass",
		QuietTimeouts: true,
		SummaryLevel:  zap.DebugLevel,
		Summarize:     func(last *Result, _ error) ([]zap.Field, bool) { return last.fields(), last.taken() > 0 },
	}
	return s, nil
}

// loopState is what the main loop keeps from one pass to the next.
type loopState struct {
	begun   bool      // the first pass (a full one) has run
	last    *Result   // the last pass's
	lastEnd time.Time // when it ended
	poll    pollState
	handoff bool // the pass after a handoff: polling ends with it
}

// besideLoop is what runs beside the main loop: the listener (not with
// --poll-only), the sweep and the backlog gauges. They have nothing to
// finish, so they are cancelled as soon as the main loop has let its
// batch commit.
func (s *Service) besideLoop() []lifecycle.Loop {
	loops := []lifecycle.Loop{s.sweepLoop(), s.statsLoop()}
	if !s.cfg.PollOnly {
		loops = append(loops, s.listenLoop())
	}
	return loops
}

// loopStopped ends polling with the loop (the polling lock's session
// closed with the listener) and forgets the loop's state for a later
// Start.
func (s *Service) loopStopped(context.Context) {
	if s.loop.poll.polling || s.loop.handoff {
		s.setPolling(false)
	}
	s.loop = loopState{}
}

// nextPass is how long the loop waits for a wake-up after a successful
// pass: --sweep-interval (a pass then takes whatever the floor holds; the
// sweep beside the loop wakes it as soon as it finds rows), or the poll's
// wait while the drainer polls (poll.go).
func (s *Service) nextPass(*Result) time.Duration {
	if s.loop.poll.polling {
		return s.loop.poll.wait
	}
	return s.cfg.SweepInterval
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
// the wake-up is handled) and those that come during a failed pass's
// backoff (the loop hears none then; the retry's pass takes the floor).
func (s *Service) signal(cause string) {
	s.metrics.wakeups.WithLabelValues(cause).Inc()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// pass is one pass. Run alone (one-shot), nothing says where rows are, so
// everything staged is due: it asks the floor for full passes until one
// takes nothing. In the loop it first waits for company (coalesce.go) or,
// while polling, drains from the low-water mark (poll.go), and after the
// drain steers polling. A failed pass makes the next one a full pass: the
// failed drain's rows may lie anywhere from its floor on. A pass moves
// past rows another transaction holds locked; the next takes those it has
// released meanwhile (a killed enqueuer's batch, rolled back once the
// server notices).
func (s *Service) pass(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
	if stop.OneShot() {
		s.floor.lowerUntilEmpty()
		return s.drainFloor(ctx, stop)
	}
	ls := &s.loop
	switch {
	case !ls.begun:
		// The first pass is a full one: rows committed while no enqueuer
		// ran notified no one.
		ls.begun = true
		s.floor.lower(fullPass)
		s.metrics.wakeups.WithLabelValues(wakeStart).Inc()
	case ls.poll.polling:
		s.pollFloor()
	case ls.last != nil:
		s.coalesce(ctx, stop, ls.last.taken(), ls.lastEnd)
	}
	res, err := s.drainFloor(ctx, stop)
	ls.last, ls.lastEnd = res, time.Now()
	if err != nil {
		s.floor.lower(fullPass)
		s.metrics.wakeups.WithLabelValues(wakeRetry).Inc()
	} else {
		if ls.handoff {
			// The drain that saw the rows of every transaction that
			// skipped its notification is done.
			ls.handoff = false
			s.setPolling(false)
		}
		ls.handoff = s.steerPolling(ctx, &ls.poll, res.taken(), ls.lastEnd) || ls.handoff
	}
	s.signals.passed.Signal(struct{}{})
	return res, err
}

// drainFloor takes the floor (where notifications, the sweep and
// full-pass requests say rows are) and drains from it, again while the
// floor asks for more, until it asks for nothing or a stop is requested
// (checked between batches). ctx ending aborts the batch in progress. The
// Result is never nil.
func (s *Service) drainFloor(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
	res := &Result{}
	for !stop.Requested() {
		spec, ok := s.floor.take(s.takenUpTo.Load())
		if !ok {
			// A drain that began after the last request covered it.
			break
		}
		d, err := s.drain(ctx, stop, spec)
		res.add(d)
		if err != nil {
			return res, fmt.Errorf("enqueuer: drain from id %d: %w", spec.from, err)
		}
		if spec.untilEmpty && d.taken() > 0 {
			s.floor.lowerUntilEmpty()
			continue
		}
		if endPass(s.cfg.WakeCoalesce, d.taken()) {
			break
		}
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
func (s *Service) drain(ctx context.Context, stop lifecycle.Stop, spec drainSpec) (*Result, error) {
	if s.hooks.drainStarted != nil {
		s.hooks.drainStarted(spec)
	}
	if s.hooks.drainStop != nil {
		s.hooks.drainStop(stop)
	}
	total := &Result{}
	cur := &cursor{next: spec.from}
	b, err := s.runBatch(ctx, cur, spec)
	if err != nil {
		return total, err
	}
	total.addBatch(b)
	if !b.full || stop.Requested() {
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
func (s *Service) drainWorker(ctx context.Context, stop lifecycle.Stop, cur *cursor, spec drainSpec) (*Result, error) {
	total := &Result{}
	for {
		b, err := s.runBatch(ctx, cur, spec)
		if err != nil {
			return total, err
		}
		total.addBatch(b)
		if !b.full || stop.Requested() {
			return total, nil
		}
	}
}

// Package enqueuer moves transactionally staged jobs from staged_jobs into
// River, exactly once.
//
// Each batch is one transaction: take up to BatchSize committed rows in id
// order from a starting id with FOR UPDATE SKIP LOCKED (deleting them and
// returning them in the same statement), insert the valid ones into River
// with COPY through an insert-only River client on the same transaction,
// move the invalid ones to staged_jobs_dead with a reason, commit. A row is
// therefore either still staged or (a River job xor a dead row) — never
// both, never neither, whatever process dies or connection drops. There is
// no high-water mark: a row whose transaction commits late, with an id lower
// than rows already moved, is found by a later drain that starts at or
// below it (see floor.go for where drains start and why that finds every
// row).
//
// The service sleeps on LISTEN idemd_staged_jobs (a statement-level trigger
// on staged_jobs sends it at commit, with the lowest id the statement
// inserted) and sweeps every PollInterval for rows no notification told it
// about. After a wake it drains until a batch comes back short.
package enqueuer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.uber.org/zap"

	"idemd/internal/lease"
	"idemd/internal/lifecycle"
	"idemd/internal/opshttp"
)

// NotifyChannel is the channel the staged_jobs trigger notifies.
const NotifyChannel = "idemd_staged_jobs"

// Defaults, chosen by the benchmark in enqueuerbench (docs/enqueuer.md).
const (
	DefaultBatchSize     = 5000
	DefaultWorkers       = 2
	DefaultPollInterval  = 2 * time.Second
	DefaultMaxArgsBytes  = 256 << 10
	DefaultStatsInterval = 5 * time.Second
	// The listener's self-check: frequent enough that a deaf listener is
	// found within a scrape or two, rare enough to cost nothing.
	DefaultListenerCheckInterval = 30 * time.Second
	DefaultListenerCheckTimeout  = 5 * time.Second
)

// Config configures a Service. Zero values take the defaults.
type Config struct {
	// BatchSize is the most rows one transaction moves.
	BatchSize int
	// Workers is how many batches one replica moves at once while draining,
	// each in its own transaction on its own connection (SKIP LOCKED keeps
	// them disjoint). Two overlap the client's encoding with the server's
	// inserting, which is where a single worker waits.
	Workers int
	// PollInterval is the fallback wake-up when no notification arrives.
	PollInterval time.Duration
	// AllowedKinds, when non-empty, dead-letters any other job_name.
	AllowedKinds []string
	// MaxArgsBytes dead-letters rows whose job_args are larger.
	MaxArgsBytes int
	// StatsInterval is how often the backlog gauges are refreshed.
	StatsInterval time.Duration
	// PollOnly disables LISTEN: the service wakes only on PollInterval, for
	// setups where no connection can LISTEN (a transaction-mode pooler and
	// no direct URL), and to measure the article's polling design.
	PollOnly bool
	// ListenConfig is the connection the listener uses; nil: the pool's.
	// Behind a transaction-mode pooler it must be a direct or session-mode
	// connection: LISTEN is session state.
	ListenConfig *pgx.ConnConfig
	// ListenerCheckInterval is how often the listener proves itself with a
	// NOTIFY sent through the pool, which must come back within
	// ListenerCheckTimeout or the listener reconnects.
	ListenerCheckInterval time.Duration
	ListenerCheckTimeout  time.Duration
	// Logger; nil discards.
	Logger *zap.Logger
	// Metrics; nil creates unregistered ones.
	Metrics *Metrics
	// Ready is marked after every successful drain; optional.
	Ready *opshttp.Readiness
}

func (c *Config) validate() error {
	var p []string
	if c.BatchSize < 0 || c.BatchSize > 100_000 {
		p = append(p, fmt.Sprintf("batch size must be between 1 and 100000, got %d", c.BatchSize))
	}
	if c.PollInterval < 0 {
		p = append(p, "poll interval must be positive")
	}
	if c.Workers < 0 || c.Workers > 64 {
		p = append(p, fmt.Sprintf("workers must be between 1 and 64, got %d", c.Workers))
	}
	if c.MaxArgsBytes < 0 {
		p = append(p, "max args bytes must be positive")
	}
	if c.StatsInterval < 0 {
		p = append(p, "stats interval must be positive")
	}
	for _, k := range c.AllowedKinds {
		if k == "" || len(k) >= 128 {
			p = append(p, fmt.Sprintf("allowed kind %q must be 1 to 127 bytes", k))
		}
	}
	if len(p) > 0 {
		return errors.New("enqueuer config: " + strings.Join(p, "; "))
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.MaxArgsBytes == 0 {
		c.MaxArgsBytes = DefaultMaxArgsBytes
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.ListenerCheckInterval <= 0 {
		c.ListenerCheckInterval = DefaultListenerCheckInterval
	}
	if c.ListenerCheckTimeout <= 0 {
		c.ListenerCheckTimeout = DefaultListenerCheckTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	return nil
}

// Service is the enqueuer.
type Service struct {
	cfg    Config
	pool   *pgxpool.Pool
	river  *river.Client[pgx.Tx]
	valid  validator
	logger *zap.Logger
	m      *Metrics

	wake chan struct{} // a pending wake-up; buffered 1
	// floor is where the next drain starts (floor.go).
	floor *floor
	// lw is the sweep's low-water mark (sweep.go).
	lw lowWater
	// passed is the highest id this replica has taken.
	passed atomic.Int64
	// listening is true while notifications are known to arrive (the
	// listener_up gauge).
	listening atomic.Bool
	// gapLogged logs each notification gap reason once.
	gapLogged [2]sync.Once

	runner lifecycle.Runner
	// instance tells this replica's listener self-checks from others'.
	instance string

	// Test hooks: onDrain sees every drain's spec before it starts;
	// dropNotification, when it returns true, loses a notification.
	onDrain          func(drainSpec)
	dropNotification func(payload string) bool
}

// New builds a Service on pool.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// An insert-only River client: no queues, no workers. It validates and
	// encodes jobs exactly as any River client would, and inserts with COPY.
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: nil})
	if err != nil {
		return nil, fmt.Errorf("enqueuer: river client: %w", err)
	}
	s := &Service{
		cfg:      cfg,
		pool:     pool,
		river:    rc,
		valid:    validator{maxArgsBytes: cfg.MaxArgsBytes},
		logger:   cfg.Logger,
		m:        cfg.Metrics,
		wake:     make(chan struct{}, 1),
		floor:    newFloor(),
		runner:   lifecycle.Runner{Name: "enqueuer"},
		instance: lease.Holder("enqueuer"),
	}
	s.lw.mark.Store(fullPass)
	s.passed.Store(fullPass)
	if len(cfg.AllowedKinds) > 0 {
		s.valid.allowed = make(map[string]bool, len(cfg.AllowedKinds))
		for _, k := range cfg.AllowedKinds {
			s.valid.allowed[k] = true
		}
	}
	return s, nil
}

// BatchResult is what one batch did.
type BatchResult struct {
	Moved        int // rows that became River jobs
	DeadLettered int // rows moved to staged_jobs_dead
	Taken        int // rows taken from staged_jobs (Moved + DeadLettered)

	last int64 // the highest id taken
}

// DrainResult sums the batches of one drain.
type DrainResult struct {
	Batches      int
	Moved        int
	DeadLettered int
}

// takeSQL takes up to $1 committed, unlocked rows with id >= $2 in id
// order, deleting them and returning them in one statement. The rows are
// picked through staged_jobs_pkey from $2 (the drain's floor, floor.go)
// and deleted by the ctid the lock returned: a TID scan, so the delete
// neither walks the index again nor, whatever the planner believes about
// the table's size, scans the heap to join on id.
const takeSQL = `
DELETE FROM staged_jobs
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM staged_jobs WHERE id >= $2 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
))
RETURNING id, created_at, job_name, job_args, queue, priority,
          max_attempts, scheduled_at, tags, metadata`

// beginSQL begins every move transaction. While an old snapshot keeps dead
// rows, staged_jobs is a few live rows at the end of a long heap and index,
// and the planner, whose statistics say "a few rows" and "the whole range"
// for id >= $2, prefers reading every heap page (a sequential or bitmap
// scan and a sort) to walking the index from $2, which touches only the
// entries from the floor on. With those two scans switched off the take can
// only walk the index. SET LOCAL ends with the transaction: nothing stays
// on a server connection a pooler hands to someone else.
const beginSQL = `BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`

// runOnce moves one batch in one transaction: rows with id >= from. Rows
// taken with ids below gapBelow are counted as a notification gap.
func (s *Service) runOnce(ctx context.Context, from, gapBelow int64) (*BatchResult, error) {
	start := time.Now()
	res, err := s.moveBatch(ctx, from, gapBelow, false)
	if errors.Is(err, errRiverRejected) {
		// The batch was rolled back whole: its rows are back in staged_jobs.
		// Take a batch again and insert it one savepoint per row, so only the
		// offending rows are dead-lettered. (It may be other rows, if
		// another replica took these meanwhile; any bad row among them is
		// found the same way.)
		s.logger.Warn("river rejected a batch; redoing it row by row", zap.Error(err))
		res, err = s.moveBatch(ctx, from, gapBelow, true)
	}
	s.m.BatchDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		s.m.BatchErrors.Inc()
		return nil, err
	}
	s.m.Moved.Add(float64(res.Moved))
	return res, nil
}

// errRiverRejected: River refused the batch's insert for a reason in the
// data that validation did not foresee; the batch is redone row by row.
var errRiverRejected = errors.New("river rejected the batch")

// moveBatch takes, inserts and deletes one batch in one transaction.
// rowByRow inserts each job under its own savepoint, so a job River rejects
// is dead-lettered alone; the normal path inserts the batch in one COPY
// with no savepoint (two round trips fewer per batch, which is most of a
// small batch's time).
func (s *Service) moveBatch(ctx context.Context, from, gapBelow int64, rowByRow bool) (*BatchResult, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		return nil, fmt.Errorf("enqueuer batch: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	rows, err := tx.Query(ctx, takeSQL, s.cfg.BatchSize, from)
	if err != nil {
		return nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	staged := make([]stagedRow, 0, s.cfg.BatchSize)
	for rows.Next() {
		var r stagedRow
		if err := rows.Scan(&r.ID, &r.CreatedAt, &r.Kind, &r.Args, &r.Queue, &r.Priority, &r.MaxAttempts, &r.ScheduledAt, &r.Tags, &r.Metadata); err != nil {
			rows.Close()
			return nil, fmt.Errorf("enqueuer batch: scan: %w", err)
		}
		staged = append(staged, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	res := &BatchResult{Taken: len(staged), last: fullPass}
	if len(staged) == 0 {
		return res, nil
	}
	gaps, lowestGap := 0, int64(0)
	for i := range staged {
		id := staged[i].ID
		res.last = max(res.last, id)
		if id < gapBelow {
			if gaps == 0 || id < lowestGap {
				lowestGap = id
			}
			gaps++
		}
	}

	params := make([]river.InsertManyParams, 0, len(staged))
	good := make([]*stagedRow, 0, len(staged))
	var dead []deadRow
	for i := range staged {
		r := &staged[i]
		if bad := s.valid.check(r); bad != nil {
			dead = append(dead, deadRow{row: r, why: bad})
			continue
		}
		p, err := insertParams(r)
		if err != nil {
			dead = append(dead, deadRow{row: r, why: &invalid{ReasonInvalidMeta, err.Error()}})
			continue
		}
		params = append(params, p)
		good = append(good, r)
	}

	moved, more, err := s.insertRows(ctx, tx, params, good, rowByRow)
	if err != nil {
		return nil, err
	}
	dead = append(dead, more...)
	if err := insertDead(ctx, tx, dead); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueuer batch: commit: %w", err)
	}
	res.Moved = moved
	res.DeadLettered = len(dead)
	s.gap(GapSwept, gaps, zap.Int64("lowest_staged_id", lowestGap), zap.Int("rows", gaps))
	for _, d := range dead {
		s.m.DeadLettered.WithLabelValues(d.why.code).Inc()
		s.logger.Warn("staged job dead-lettered",
			zap.Int64("staged_id", d.row.ID), zap.String("kind", d.row.Kind),
			zap.String("reason", d.why.code), zap.String("detail", d.why.detail))
	}
	return res, nil
}

// insertRows inserts params into River on tx, all at once or, rowByRow,
// each under its own savepoint so only the rows River rejects are
// dead-lettered. A rejection of the whole batch returns errRiverRejected;
// errors that are not about the data (connection lost, serialization) fail
// the batch and it is retried whole.
func (s *Service) insertRows(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams, rows []*stagedRow, rowByRow bool) (int, []deadRow, error) {
	if len(params) == 0 {
		return 0, nil, nil
	}
	if !rowByRow {
		n, err := s.river.InsertManyFastTx(ctx, tx, params)
		if err == nil {
			return n, nil, nil
		}
		if isDataError(err, tx.Conn()) {
			return 0, nil, fmt.Errorf("enqueuer batch: %w: %w", errRiverRejected, err)
		}
		return 0, nil, fmt.Errorf("enqueuer batch: insert into river: %w", err)
	}
	moved := 0
	var dead []deadRow
	for i := range params {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, nil, fmt.Errorf("enqueuer batch: savepoint: %w", err)
		}
		if _, err := s.river.InsertManyFastTx(ctx, sp, params[i:i+1]); err != nil {
			if !isDataError(err, tx.Conn()) {
				return 0, nil, fmt.Errorf("enqueuer batch: insert into river: %w", err)
			}
			if err := sp.Rollback(ctx); err != nil {
				return 0, nil, fmt.Errorf("enqueuer batch: rollback savepoint: %w", err)
			}
			dead = append(dead, deadRow{row: rows[i], why: &invalid{ReasonRejectedByRiver, err.Error()}})
			continue
		}
		if err := sp.Commit(ctx); err != nil {
			return 0, nil, fmt.Errorf("enqueuer batch: release savepoint: %w", err)
		}
		moved++
	}
	return moved, dead, nil
}

// isDataError tells a row's fault from the environment's. River validates
// params before touching the database (plain errors on a live connection);
// PostgreSQL reports bad data as class 22 (data exception) or 23 (integrity
// constraint violation). Anything else — a dropped connection, a timeout, a
// cancelled context — fails the whole batch, which is retried: no row is
// dead-lettered because of the environment.
func isDataError(err error, conn *pgx.Conn) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) || pgconn.SafeToRetry(err) {
		return false
	}
	return !conn.IsClosed()
}

// rawArgs hands River the staged job_args unchanged.
type rawArgs struct {
	kind string
	args json.RawMessage
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.args, nil }

func insertParams(r *stagedRow) (river.InsertManyParams, error) {
	md, err := metadataFor(r)
	if err != nil {
		return river.InsertManyParams{}, err
	}
	opts := &river.InsertOpts{Metadata: md, Tags: r.Tags}
	if r.Queue != nil {
		opts.Queue = *r.Queue
	}
	if r.Priority != nil {
		opts.Priority = int(*r.Priority)
	}
	if r.MaxAttempts != nil {
		opts.MaxAttempts = int(*r.MaxAttempts)
	}
	if r.ScheduledAt != nil {
		opts.ScheduledAt = *r.ScheduledAt
	}
	return river.InsertManyParams{Args: rawArgs{kind: r.Kind, args: r.Args}, InsertOpts: opts}, nil
}

type deadRow struct {
	row *stagedRow
	why *invalid
}

func insertDead(ctx context.Context, tx pgx.Tx, dead []deadRow) error {
	if len(dead) == 0 {
		return nil
	}
	// Few rows, rarely: a plain batch of inserts is simplest and clearest.
	batch := &pgx.Batch{}
	for _, d := range dead {
		r := d.row
		batch.Queue(`INSERT INTO staged_jobs_dead (id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			r.ID, r.CreatedAt, r.Kind, json.RawMessage(r.Args), r.Queue, r.Priority, r.MaxAttempts, r.ScheduledAt, r.Tags, nullJSON(r.Metadata), d.why.code+": "+d.why.detail)
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("enqueuer batch: dead-letter: %w", err)
	}
	return nil
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

// Drain runs full passes (batches from the start of staged_jobs until one
// comes back short) until a pass takes nothing: the table is then empty of
// committed, unlocked rows. A pass moves past rows another transaction
// holds locked; the next pass takes those it has released meanwhile (a
// killed enqueuer's batch, rolled back once the server notices). It is
// `enqueuer --once`; a started service drains from its floor on every
// wake-up instead, and its sweep finds such rows.
func (s *Service) Drain(ctx context.Context) (*DrainResult, error) {
	total := &DrainResult{}
	for {
		res, err := s.drain(ctx, nil, drainSpec{from: fullPass, gapBelow: fullPass})
		total.Batches += res.Batches
		total.Moved += res.Moved
		total.DeadLettered += res.DeadLettered
		if err != nil || res.Moved+res.DeadLettered == 0 {
			return total, err
		}
	}
}

func (s *Service) drain(ctx context.Context, stop <-chan struct{}, spec drainSpec) (*DrainResult, error) {
	if s.onDrain != nil {
		s.onDrain(spec)
	}
	// The first batch runs alone. In the steady state (a few rows per
	// wake-up) it is the only one, and a second worker would only add an
	// empty transaction competing for the same WAL flush. Only when it comes
	// back full is there a backlog worth draining with every worker.
	total := &DrainResult{}
	cur := &cursor{next: spec.from}
	full, err := s.batch(ctx, total, cur, spec)
	if err != nil || !full || stopped(stop) {
		return total, err
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range s.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.drainWorker(ctx, stop, cur, spec)
			mu.Lock()
			defer mu.Unlock()
			total.Batches += res.Batches
			total.Moved += res.Moved
			total.DeadLettered += res.DeadLettered
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	return total, firstErr
}

// drainWorker moves batches until one comes back short.
func (s *Service) drainWorker(ctx context.Context, stop <-chan struct{}, cur *cursor, spec drainSpec) (*DrainResult, error) {
	total := &DrainResult{}
	for {
		full, err := s.batch(ctx, total, cur, spec)
		if err != nil || !full || stopped(stop) {
			return total, err
		}
	}
}

// batch moves one batch from the drain's cursor, adds it to total and
// reports whether it came back full (so more rows may be waiting).
func (s *Service) batch(ctx context.Context, total *DrainResult, cur *cursor, spec drainSpec) (bool, error) {
	res, err := s.runOnce(ctx, cur.claim(s.cfg.BatchSize), spec.gapBelow)
	if err != nil {
		return false, err
	}
	if res.Taken > 0 {
		for p := s.passed.Load(); res.last > p && !s.passed.CompareAndSwap(p, res.last); p = s.passed.Load() {
		}
	}
	full := res.Taken >= s.cfg.BatchSize
	if full {
		cur.passed(res.last)
	}
	total.Batches++
	total.Moved += res.Moved
	total.DeadLettered += res.DeadLettered
	// Every committed batch is progress: a drain of a huge backlog must not
	// look stale to /readyz while it is working.
	if s.cfg.Ready != nil {
		s.cfg.Ready.MarkPass(time.Now())
	}
	return full, nil
}

// stopped reports whether Stop has asked the drain to end after this batch.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// Start launches the listener and the drain loop. It returns at once.
func (s *Service) Start(ctx context.Context) error {
	// Readiness is set up before the loop can first mark a pass.
	if s.cfg.Ready != nil {
		s.cfg.Ready.MarkStarted(time.Now())
		s.cfg.Ready.MaxPassAge = max(3*s.cfg.PollInterval, 30*time.Second)
	}
	if err := s.runner.Start(ctx, s.run); err != nil {
		return err
	}
	s.trigger("start")
	return nil
}

// Stop lets the current batch finish and stops; if ctx ends first, the
// batch is abandoned (its transaction rolls back: nothing is lost).
func (s *Service) Stop(ctx context.Context) error {
	return s.runner.Stop(ctx)
}

// run is the service's background work: the drain loop, with the
// listener, the sweep and the stats loop beside it. Those have nothing to
// finish, so they are cancelled as soon as the drain loop has let its batch
// commit.
func (s *Service) run(ctx context.Context, stop <-chan struct{}) {
	auxCtx, cancelAux := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		if s.cfg.PollOnly {
			s.m.PollOnly.Set(1)
			return
		}
		s.listen(auxCtx)
	}()
	go func() { defer wg.Done(); s.statsLoop(auxCtx) }()
	go func() { defer wg.Done(); s.sweepLoop(auxCtx) }()
	s.loop(ctx, stop)
	cancelAux()
	wg.Wait()
}

// trigger asks the loop for a full pass: a drain from the start of
// staged_jobs (start, reconnect, retry).
func (s *Service) trigger(cause string) {
	s.floor.lower(fullPass)
	s.signal(cause)
}

// signal wakes the loop after the floor was lowered. Every signal is
// counted by its cause, including those coalesced into a wake-up that is
// already pending (which will see their rows too: the floor is taken when
// the wake-up is handled).
func (s *Service) signal(cause string) {
	s.m.Wakeups.WithLabelValues(cause).Inc()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Service) loop(ctx context.Context, stop <-chan struct{}) {
	failures := 0
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		spec, ok := s.floor.take(s.passed.Load())
		if !ok {
			// A drain that began after this wake-up's floor was set
			// covered it.
			continue
		}
		res, err := s.drain(ctx, stop, spec)
		if err != nil {
			failures++
			backoff := retryDelay(failures)
			s.logger.Error("drain failed; retrying", zap.Error(err), zap.Duration("retry_in", backoff), zap.Int("moved_before_error", res.Moved))
			select {
			case <-time.After(backoff):
				s.trigger("retry")
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		} else {
			failures = 0
			if res.Moved+res.DeadLettered > 0 {
				s.logger.Debug("drained", zap.Int("moved", res.Moved), zap.Int("dead_lettered", res.DeadLettered),
					zap.Int("batches", res.Batches), zap.Int64("from_id", spec.from))
			}
		}
	}
}

// retryDelay is exponential with full jitter, capped at 10 s.
func retryDelay(failures int) time.Duration {
	base := 100 * time.Millisecond << min(failures, 7)
	base = min(base, 10*time.Second)
	return time.Duration(rand.Int64N(int64(base))) + 50*time.Millisecond
}

// listen holds a dedicated connection (not a pool one: LISTEN is session
// state) and turns notifications into wake-ups. After a reconnect it wakes
// the loop, since notifications sent while it was down are lost. A listener
// that stays connected but deaf (LISTEN through a transaction-mode pooler
// "succeeds" and then hears nothing) is found by its self-check; the first
// failure of an outage is a warning, the retries after it are not.
func (s *Service) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, func() {
			if failures > 0 {
				s.logger.Info("listener is back: notifications arrive again", zap.Int("failed_attempts", failures))
			}
			failures = 0
		})
		if ctx.Err() != nil {
			return
		}
		failures++
		s.listening.Store(false)
		s.m.ListenerUp.Set(0)
		delay := retryDelay(failures)
		log := s.logger.Debug
		if failures == 1 {
			log = s.logger.Warn
		}
		log("listener lost; waking by polling until it is back", zap.Error(err), zap.Duration("retry_in", delay), zap.Duration("poll_interval", s.cfg.PollInterval))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
	}
}

// listenerCheckPrefix marks the listener's own NOTIFYs on the channel;
// they are not wake-ups.
const listenerCheckPrefix = "idemd-listener-check:"

func (s *Service) listenOnce(ctx context.Context, connected func()) error {
	cfg := s.cfg.ListenConfig
	if cfg == nil {
		cfg = s.pool.Config().ConnConfig
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return fmt.Errorf("enqueuer listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel}.Sanitize()); err != nil {
		return fmt.Errorf("enqueuer listen: %w", err)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	arrived := make(chan string, 1)
	checkErr := make(chan error, 1)
	go func() {
		err := s.checkListener(lctx, arrived, connected)
		checkErr <- err
		cancel()
	}()
	for {
		n, err := conn.WaitForNotification(lctx)
		if err != nil {
			cancel()
			if cerr := <-checkErr; cerr != nil {
				return cerr
			}
			return fmt.Errorf("enqueuer listen: wait: %w", err)
		}
		if strings.HasPrefix(n.Payload, listenerCheckPrefix) {
			select {
			case arrived <- n.Payload:
			default:
			}
			continue
		}
		if s.dropNotification != nil && s.dropNotification(n.Payload) {
			continue
		}
		s.notified(n.Payload)
	}
}

// notified handles a staged_jobs notification: its payload is the lowest
// id its statement inserted (migration 00015), where the next drain must
// start at the latest. One without a number makes the next drain a full
// pass.
func (s *Service) notified(payload string) {
	low, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		s.gap(GapNoFloor, 1, zap.String("payload", truncate(payload, 64)))
		low = fullPass
	}
	s.floor.lower(low)
	s.signal("notify")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkListener sends a NOTIFY through the pool, the path the API's own
// notifications take, and waits for it on the listener; then again every
// ListenerCheckInterval. The listener counts as up only once a round trip
// came back, so listener_up means notifications arrive, not merely that a
// connection is open. It returns (ending the listener's connection) when a
// round trip fails.
func (s *Service) checkListener(ctx context.Context, arrived <-chan string, connected func()) error {
	for seq := 0; ; seq++ {
		payload := fmt.Sprintf("%s%s:%d", listenerCheckPrefix, s.instance, seq)
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, payload); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("enqueuer listen: send the self-check NOTIFY: %w", err)
		}
		timeout := time.NewTimer(s.cfg.ListenerCheckTimeout)
	wait:
		for {
			select {
			case <-ctx.Done():
				timeout.Stop()
				return nil
			case <-timeout.C:
				s.m.ListenerCheckFailures.Inc()
				return fmt.Errorf("enqueuer listen: a NOTIFY sent through the pool did not reach the listener within %s "+
					"(behind a transaction-mode pooler, give --listen-database-url a direct or session-mode URL)", s.cfg.ListenerCheckTimeout)
			case p := <-arrived:
				if p == payload {
					timeout.Stop()
					break wait
				}
				// Another replica's check, or an earlier one of ours.
			}
		}
		if seq == 0 {
			connected()
			s.listening.Store(true)
			s.m.ListenerUp.Set(1)
			s.trigger("reconnect")
		}
		t := time.NewTimer(s.cfg.ListenerCheckInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// statsLoop refreshes the backlog gauges. count(*) is exact and cheap at the
// backlogs this table should ever have; both it and the oldest row are
// read through the primary key from the sweep's low-water mark, so neither
// walks the dead rows an old snapshot keeps below it.
func (s *Service) statsLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		if err := s.refreshStats(ctx); err != nil && ctx.Err() == nil {
			s.logger.Debug("backlog stats failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// statsSQL counts the staged rows and the age of the oldest, from the id $1
// below which none exists.
const statsSQL = `
SELECT (SELECT count(*) FROM staged_jobs WHERE id >= $1),
       (SELECT extract(epoch FROM now() - created_at)::float8 FROM staged_jobs WHERE id >= $1 ORDER BY id LIMIT 1)`

func (s *Service) refreshStats(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	var age *float64
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: beginSQL}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, statsSQL, s.lw.mark.Load()).Scan(&n, &age)
	})
	if err != nil {
		return fmt.Errorf("enqueuer stats: %w", err)
	}
	s.m.Backlog.Set(float64(n))
	if age != nil {
		s.m.OldestAge.Set(*age)
	} else {
		s.m.OldestAge.Set(0)
	}
	return nil
}

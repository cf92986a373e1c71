// Package reaper deletes idempotency keys past the retention window in
// bounded batches, and copies the ones nobody finished into
// idempotency_key_reviews in the same statement that deletes them, so no
// unprocessable key disappears silently (docs/design.md, invariant 4).
//
// A run holds the reaper's lease (internal/lease), renewed before every
// round of batches and fenced by each batch, so runs never overlap whether
// they come from a CronJob, a manual run or a second Deployment, and
// whatever pooler sits between them and the database; a run that finds
// another live run says so and ends successfully, and a run that finds the
// lease of a dead run waits for it to expire and takes over. Each batch is its own transaction on any pooled
// connection, with every setting local to it: a failing batch never undoes
// the work of the batches before it, and nothing outlives a batch on a
// server connection.
//
// The service has the shape of docs/architecture.md: a run is a pass of
// the lifecycle.Skeleton the Service embeds (RunOnce is one run), a batch
// is its unit, and Start runs passes on --schedule.
package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/robfig/cron/v3"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lifecycle/testsignal"
	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/review"
)

// Result is what one run did. Counts are of committed work: a batch that
// failed or was rolled back contributes nothing.
type Result struct {
	// LockHeld: another live run held the lease, so this one did nothing
	// (successfully). LeaseHolder names that run.
	LockHeld    bool
	LeaseHolder string
	// TookOverFrom names the run whose lease this one took after it
	// expired: that run ended without releasing it (killed, or cut off from
	// the database).
	TookOverFrom string
	// WALCompression is the wal_compression the batches ran with; empty
	// when they kept the server's setting.
	WALCompression string
	DryRun         bool
	// Plan is what a dry run found a run would do now; nil otherwise.
	Plan *Plan

	// Deleted keys past the horizon.
	Deleted int64
	// Unprocessable of them were unfinished or given up by the completer;
	// each has a review, either created now (Flagged) or earlier.
	Unprocessable int64
	// Flagged reviews created, by reason.
	Flagged         int64
	FlaggedByReason map[string]int64

	// Batches committed, and how often a batch hit --statement-timeout and
	// was retried at half the size.
	Batches       int
	BatchTimeouts int
	// LockedBatches met a key whose row lock another transaction held and
	// were redone skipping locked keys.
	LockedBatches int
	// ConcurrentBatches ran in a round beside other batches (--concurrency).
	ConcurrentBatches int
	// OrderedBatches found nothing to delete in their created_at range
	// although keys were left (more than a batch of keys share one
	// created_at, or every key in the range is in flight) and were redone
	// in id order.
	OrderedBatches int
	FinalBatchSize int
	Duration       time.Duration
	Complete       bool   // nothing eligible was left when the run ended
	StopReason     string // why an incomplete run stopped: max_runtime, shutdown, critical_load, error
	// StopDetail is the measurement that crossed --critical-load.
	StopDetail string
	// Throttled is the time the run waited between batches for its
	// throttle; ThrottleReason the reason of its latest wait.
	Throttled      time.Duration
	ThrottleReason string
	// Paced is the time the run waited for its WAL pacer: its pace, not
	// throttled time. WALRate is the pacer's rate at the run's end (bytes
	// per second; 0: not paced), halved from its start for each
	// RequestedCheckpoints with wal_rate=auto. CommitBudget is the
	// commit_latency the batch size adapted to (0: none).
	Paced                time.Duration
	WALRate              float64
	RequestedCheckpoints int64
	CommitBudget         time.Duration
}

// BlockedError is a batch that a foreign key with ON DELETE RESTRICT or NO
// ACTION refused. The run stops (it cannot make progress past that key) and
// keeps the batches it committed before.
type BlockedError struct {
	Constraint string // the foreign key constraint's name
	Table      string // the referencing table
	Detail     string // PostgreSQL's detail: which key is still referenced
	Err        error
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("deleting keys is blocked by foreign key constraint %q on table %q (%s): "+
		"make it ON DELETE SET NULL or CASCADE, or remove the referencing rows", e.Constraint, e.Table, e.Detail)
}

func (e *BlockedError) Unwrap() error { return e.Err }

// Stop reasons of an incomplete or failed run (Result.StopReason, the run
// history's stop_reason).
const (
	stopShutdown   = "shutdown"    // SIGTERM, Stop, or ctx ended
	stopMaxRuntime = "max_runtime" // --max-runtime passed
	stopError      = "error"       // a failure ended the run
	// stopCriticalLoad: the load crossed --critical-load (throttled.go).
	stopCriticalLoad = "critical_load"
)

// stop is why a run ended before it was complete: what the run's steps
// (a round, a failed batch, the throttle) return, and only reapWithLease
// writes into the Result. The zero value: the run goes on, or completed.
type stop struct {
	reason string
	// detail is the measurement that crossed --critical-load.
	detail string
}

// ErrCapExceeded is returned (wrapped) when a run would delete or flag more
// than --max-deletes or --max-flags.
var ErrCapExceeded = errors.New("per-run cap exceeded")

// Service runs the reaper, once (RunOnce) or on a schedule (Start/Stop).
type Service struct {
	// Skeleton gives the Service its Start (runs on --schedule until Stop
	// or ctx ends; refused without a schedule), Stop (asks the run in
	// progress to stop after its current batch, waits until ctx ends, then
	// cuts the batch, which rolls back; on return no run of this process
	// goes on and its lease is released) and RunOnce (one run: take the
	// lease, reap or plan, log the summary; when ctx ends the batch in
	// progress rolls back and the run ends incomplete, stop_reason
	// shutdown; the Result is never nil, even with an error).
	lifecycle.Skeleton[*Result]

	cfg     Config
	logger  *zap.Logger
	metrics *metrics
	// holder names this process in the lease table.
	holder string
	// schedule is --schedule parsed; nil without one. Tests replace it.
	schedule cron.Schedule

	// pinnedNow replaces the database's now() in every statement; tests use
	// it to put keys exactly at the horizon. Production leaves it nil.
	pinnedNow *time.Time
	hooks     testHooks
	signals   testSignals
}

// testSignals tell tests that a run reached a point; tests only wait on
// them (internal/lifecycle/testsignal). Free in production.
type testSignals struct {
	passed  testsignal.Signal[*Result]           // a scheduled run ended
	next    testsignal.Signal[time.Duration]     // the schedule's wait before the next run
	decided testsignal.Signal[throttle.Decision] // the throttle decided before a round
}

// testHooks are the points where a test must act inside a run while the
// run waits for it, which a signal cannot do: hold a run inside its lease
// (the overlap tests), read a batch transaction's own settings (the
// wal_compression test), change or count the table between two batches
// (the boundary and cap tests). nil in production.
type testHooks struct {
	afterLock  func(ctx context.Context)              // the lease is held, no batch yet
	inBatch    func(ctx context.Context, tx pgx.Tx)   // a batch's settings are in force, its statement not run yet
	afterRound func(ctx context.Context, batches int) // a round's batches ended (batches committed so far), the next round not begun
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
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, logger: cfg.Logger, metrics: m, holder: lease.Holder("reaper")}
	s.Skeleton = s.skeleton()
	if cfg.Schedule != "" {
		if s.schedule, err = cronParser.Parse(cfg.Schedule); err != nil {
			return nil, fmt.Errorf("reaper: parse schedule: %w", err)
		}
	}
	return s, nil
}

// skeleton is the reaper's part of the services' skeleton. A run is due
// at each time of the schedule, the first one included (a restart does
// not reap off-schedule); a run still going at the next time makes that
// time be skipped, and a failed run waits for the next time like any
// other: the schedule, never a retry, decides when the next run is.
// Across processes the lease keeps runs from overlapping.
func (s *Service) skeleton() lifecycle.Skeleton[*Result] {
	untilNext := func() time.Duration { return time.Until(s.schedule.Next(time.Now())) }
	return lifecycle.Skeleton[*Result]{
		Name:       "reaper",
		Logger:     s.logger,
		Ready:      s.cfg.Ready,
		MaxPassAge: func() time.Duration { return maxPassAge(s.schedule, time.Now(), s.cfg.MaxRuntime) },
		Pass: func(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
			res, err := s.pass(ctx, stop)
			s.signals.passed.Signal(res)
			return res, err
		},
		First: untilNext,
		CanStart: func() error {
			if s.schedule == nil {
				return errors.New("reaper: Start needs --schedule; use RunOnce for a single run")
			}
			return nil
		},
		Next: func(*Result) time.Duration {
			d := untilNext()
			s.signals.next.Signal(d)
			return d
		},
		Summary:      "reaper run summary",
		SummaryLevel: zap.InfoLevel,
		Summarize:    s.summarize,
	}
}

// pass is one run. A stop request asks it to end after its current batch;
// ctx ending also cuts the batch in progress, which rolls back (SIGTERM in
// a one-shot run, Stop's deadline). Everything but the batches (the lease
// wait, the caps' count, the dry run) stops at either.
func (s *Service) pass(ctx context.Context, stop lifecycle.Stop) (*Result, error) {
	start := time.Now()
	res := &Result{DryRun: s.cfg.DryRun, FlaggedByReason: map[string]int64{}, FinalBatchSize: s.cfg.BatchSize}
	soft, cancel := stop.Context(ctx)
	defer cancel()
	var err error
	if s.cfg.DryRun {
		// A dry run changes nothing, so it needs no lease: an operator
		// previewing while a run is going still gets an answer.
		res.Plan, err = s.dryRun(soft)
		res.Complete = err == nil
	} else {
		err = s.reapWithLease(ctx, soft, res, start)
	}
	res.Duration = time.Since(start)
	s.finish(res, err)
	return res, err
}

// reapWithLease takes the reaper's lease, keeps it renewed while the run
// reaps, and releases it at the end, recording the run in the history
// (history.go). A run that finds another live run holding it does nothing
// (res.LockHeld).
func (s *Service) reapWithLease(ctx, soft context.Context, res *Result, start time.Time) (err error) {
	held, err := s.takeLease(soft, res)
	if err != nil || !held {
		s.recordUnleasedRun(ctx, start, res, err)
		return err
	}
	run, err := s.startRun(ctx, start)
	defer func() { s.endRun(ctx, run, res, err) }()
	if err != nil {
		res.StopReason = stopError
		return err
	}
	defer lifecycle.Beside(soft, s.heartbeat())()

	if s.hooks.afterLock != nil {
		s.hooks.afterLock(soft)
	}
	if s.probeWALCompression(soft) {
		res.WALCompression = s.cfg.WALCompression
	}
	if err := s.checkCaps(soft); err != nil {
		res.StopReason = stopError
		return err
	}
	st, err := s.reap(ctx, soft, res, start, run)
	res.StopReason, res.StopDetail = st.reason, st.detail
	return err
}

// probeWALCompression reports whether --wal-compression can be set in this
// run's batch transactions (SET LOCAL, so nothing outlives a batch on a
// pooled connection). wal_compression is a superuser setting: a role
// without superuser or GRANT SET ON PARAMETER wal_compression (PostgreSQL
// 15+) is refused, as is a method the server was built without, and the run
// goes on with the server's setting, since compression changes how many
// bytes the WAL takes, never what is deleted. The probe is its own
// transaction because a refused set_config would abort a batch's.
func (s *Service) probeWALCompression(ctx context.Context) bool {
	if s.cfg.WALCompression == "server" {
		return false
	}
	err := s.cfg.Calls.Do(ctx, "reaper wal_compression", func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT set_config('wal_compression', @wal_compression, true)", pgx.NamedArgs{"wal_compression": s.cfg.WALCompression})
			return err
		})
	})
	if err == nil {
		return true
	}
	var pgErr *pgconn.PgError
	switch {
	case ctx.Err() != nil:
		// Shutting down: the run stops at its next step, which says so.
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		s.logger.Info("could not set wal_compression for the reaper's batches; their WAL uses the server's setting "+
			"(grant it with GRANT SET ON PARAMETER wal_compression TO <reaper role>, or pass --wal-compression server)",
			zap.String("wal_compression", s.cfg.WALCompression), zap.Error(err))
	case errors.As(err, &pgErr) && pgErr.Code == "22023": // invalid_parameter_value
		s.logger.Info("could not set wal_compression for the reaper's batches: the server does not support this method; "+
			"their WAL uses the server's setting (pick another --wal-compression, or server)",
			zap.String("wal_compression", s.cfg.WALCompression), zap.Error(err))
	default:
		s.logger.Warn("could not set wal_compression for the reaper's batches; their WAL uses the server's setting",
			zap.String("wal_compression", s.cfg.WALCompression), zap.Error(err))
	}
	return false
}

// reap deletes keys round by round (round.go) until a batch comes back
// short (nothing eligible left), the run's time is up, the run is asked to
// stop (soft), or a batch fails for good. Batches run on ctx: only it cuts
// one short. It returns why the run stopped (the zero stop when it is
// complete); the Result's counts are the committed batches' (account).
func (s *Service) reap(ctx, soft context.Context, res *Result, start time.Time, run int64) (stop, error) {
	batchSize := s.cfg.BatchSize
	var cursor *batchCursor
	alone := false // the next round redoes a batch of a concurrent round
	thr := s.newRunThrottle()
	defer s.endStretch(thr)
	if err := s.startThrottle(soft, thr, res); err != nil {
		if soft.Err() != nil {
			return stop{reason: stopShutdown}, nil
		}
		return stop{reason: stopError}, err
	}
	for {
		if soft.Err() != nil {
			return stop{reason: stopShutdown}, nil
		}
		if time.Since(start) >= s.cfg.MaxRuntime {
			return stop{reason: stopMaxRuntime}, nil
		}
		w := s.throttleWait(soft, start, run, thr, res)
		res.Throttled += w.waited
		res.Paced += w.paced
		if w.reason != "" {
			res.ThrottleReason = string(w.reason)
		}
		if w.stop.reason != "" || w.err != nil {
			return w.stop, w.err
		}
		// The round's batches only fence the lease, so renew it now: they
		// run under an expiry that outlasts any of them (--lease-ttl is
		// longer than --statement-timeout).
		if err := s.renewLease(ctx); err != nil {
			return s.roundFailed(ctx, err, res.Batches)
		}
		width := roundWidth(&s.cfg.Settings, batchSize, res.Deleted, res.Flagged)
		if alone {
			width = 1
		}
		size := thr.batchSize(batchSize, width)
		res.FinalBatchSize = size
		job := batchJob{
			run:            run,
			batchSize:      s.batchLimit(size, res.Deleted),
			cursor:         cursor,
			deleted:        res.Deleted,
			flagged:        res.Flagged,
			walCompression: res.WALCompression,
		}
		jobs, err := s.planRound(ctx, job, width)
		if err != nil {
			return s.roundFailed(ctx, err, res.Batches)
		}
		probed := thr.read.ProbeRound(ctx)
		end := s.runRound(ctx, jobs)
		var keys int64
		for _, b := range end.committed {
			s.account(res, b)
			keys += b.deleted
		}
		thr.roundEnded(keys, probed())
		cursor, alone = end.cursor, end.alone
		if alone {
			s.logger.Debug("a batch of a concurrent round is redone alone", zap.Int("batches", res.Batches), zap.Error(end.err))
		}
		if end.err != nil {
			if ctx.Err() != nil {
				// The batch was cut (SIGTERM in a one-shot run, Stop's
				// deadline) and rolled back: the run was stopped, not
				// failed, and the next run deletes those keys.
				return stop{reason: stopShutdown}, nil
			}
			var st stop
			if batchSize, st, err = s.batchFailed(soft, end.err, batchSize, res); err != nil {
				return st, err
			}
			continue
		}
		if s.hooks.afterRound != nil {
			s.hooks.afterRound(soft, res.Batches)
		}
		if !end.more {
			res.Complete = true
			return stop{}, nil
		}
		if err := s.measureBudget(soft, thr, res); err != nil {
			if soft.Err() != nil {
				return stop{reason: stopShutdown}, nil
			}
			return stop{reason: stopError}, err
		}
		s.pause(soft)
	}
}

// renewLease renews the run's lease between rounds, within
// --statement-timeout like any of the run's statements (a renewal waits
// only for a taker's short upsert or the heartbeat's own renewal).
func (s *Service) renewLease(ctx context.Context) error {
	return s.cfg.Calls.DoWithin(ctx, leaseRenewOp, s.cfg.StatementTimeout, func(ctx context.Context) error {
		return lease.Renew(ctx, s.cfg.Pool, LeaseName, s.holder, s.cfg.LeaseTTL)
	})
}

// leaseRenewOp names the lease's renewals when they run out of their bound.
const leaseRenewOp = "reaper lease: renew"

// roundFailed ends the run for a failure outside the batches (the lease's
// renewal, the round's ranges), after batches committed ones.
func (s *Service) roundFailed(ctx context.Context, err error, batches int) (stop, error) {
	if ctx.Err() != nil {
		return stop{reason: stopShutdown}, nil
	}
	return stop{reason: stopError}, fmt.Errorf("reaper: before batch %d: %w", batches+1, err)
}

// batchLimit is how many keys the next batch may take: the batch size, or
// at most one key past --max-deletes. If the batch finds that key, keys
// crossed the horizon during the run beyond what the pre-check allowed, and
// the batch's own check rolls it back and stops the run. If not, the batch
// comes back short and the run is complete.
func (s *Service) batchLimit(batchSize int, deleted int64) int {
	if s.cfg.MaxDeletes > 0 {
		if left := s.cfg.MaxDeletes - deleted; left+1 < int64(batchSize) {
			return int(left + 1)
		}
	}
	return batchSize
}

// batchFailed decides what a failed batch means for the run: a statement
// timeout is retried at half the size (the new size comes back, with a nil
// error); anything else ends the run with the error returned, and the
// stop it is. soft ended: the run was stopping, and a timeout is no reason
// to go on.
func (s *Service) batchFailed(soft context.Context, err error, batchSize int, res *Result) (int, stop, error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "57014" && soft.Err() == nil {
		// statement_timeout: the database is slower than the batch size
		// assumes. Halve and retry rather than fail the run, down to a
		// floor below which the problem is not the batch size.
		s.metrics.batchTimeouts.Inc()
		res.BatchTimeouts++
		if batchSize <= minBatchSize {
			return batchSize, stop{reason: stopError}, fmt.Errorf("reaper: batch %d timed out after %s even at %d keys: %w", res.Batches+1, s.cfg.StatementTimeout, batchSize, err)
		}
		batchSize = max(batchSize/2, minBatchSize)
		res.FinalBatchSize = batchSize
		s.logger.Warn("batch hit the statement timeout; halving the batch batchSize",
			zap.Duration("statement_timeout", s.cfg.StatementTimeout), zap.Int("batch_size", batchSize))
		return batchSize, stop{}, nil
	}
	failed := stop{reason: stopError}
	switch {
	case errors.Is(err, ErrCapExceeded):
		return batchSize, failed, fmt.Errorf("reaper: batch %d rolled back: %w; the %d keys deleted by earlier batches stay deleted", res.Batches+1, err, res.Deleted)
	case errors.As(err, &pgErr) && pgErr.Code == "23503":
		blocked := &BlockedError{Constraint: pgErr.ConstraintName, Table: pgErr.TableName, Detail: pgErr.Detail, Err: err}
		return batchSize, failed, fmt.Errorf("reaper: batch %d: %w; the %d keys deleted by earlier batches of this run stay deleted", res.Batches+1, blocked, res.Deleted)
	default:
		if soft.Err() != nil {
			failed.reason = stopShutdown
		}
		return batchSize, failed, fmt.Errorf("reaper: batch %d: %w", res.Batches+1, err)
	}
}

// pause waits --batch-pause between batches, or until the run is asked to
// stop.
func (s *Service) pause(soft context.Context) {
	if s.cfg.BatchPause <= 0 {
		return
	}
	t := time.NewTimer(s.cfg.BatchPause)
	defer t.Stop()
	select {
	case <-soft.Done():
	case <-t.C:
	}
}

// account adds a committed batch to the run's Result (the only place the
// batches change it), the metrics and the debug log.
func (s *Service) account(res *Result, b batchResult) {
	s.metrics.batchDuration.Observe(b.duration.Seconds())
	s.metrics.batches.Inc()
	s.metrics.deleted.Add(float64(b.deleted))
	s.metrics.flagged.WithLabelValues(review.ReasonUnfinishedAtRetention).Add(float64(b.flaggedUnfinished))
	s.metrics.flagged.WithLabelValues(review.ReasonCompleterGaveUp).Add(float64(b.flaggedGaveUp))
	res.Batches++
	res.Deleted += b.deleted
	if b.ordered {
		res.OrderedBatches++
	}
	if b.locked {
		res.LockedBatches++
	}
	if b.concurrent {
		res.ConcurrentBatches++
	}
	res.Unprocessable += b.unprocessable
	res.Flagged += b.flagged()
	if b.flaggedUnfinished > 0 {
		res.FlaggedByReason[review.ReasonUnfinishedAtRetention] += b.flaggedUnfinished
	}
	if b.flaggedGaveUp > 0 {
		res.FlaggedByReason[review.ReasonCompleterGaveUp] += b.flaggedGaveUp
	}
	s.logger.Debug("batch committed", zap.Int("batch", res.Batches), zap.Int64("deleted", b.deleted),
		zap.Int64("flagged", b.flagged()), zap.Duration("duration", b.duration))
}

// runResult is what a run's result was: the result label of
// idemd_reaper_runs_total, the summary's result and the history's.
func runResult(res *Result, err error) string {
	switch {
	case err != nil:
		return resultError
	case res.LockHeld:
		return resultLockHeld
	case res.DryRun:
		return resultDryRun
	case !res.Complete:
		return resultIncomplete
	}
	return resultComplete
}

// finish records the run in the metrics.
func (s *Service) finish(res *Result, err error) {
	result := runResult(res, err)
	s.metrics.runs.WithLabelValues(result).Inc()
	if !res.LockHeld {
		s.metrics.runDuration.Observe(res.Duration.Seconds())
	}
	if result == resultComplete {
		s.metrics.lastSuccess.SetToCurrentTime()
	}
}

// summarize is the run's summary line (every run has one: the schedule
// shows it ran, a one-shot run says what it did).
func (s *Service) summarize(res *Result, err error) ([]zap.Field, bool) {
	result := runResult(res, err)
	fields := []zap.Field{
		zap.String("result", result),
		zap.Int64("deleted", res.Deleted),
		zap.Int64("flagged", res.Flagged),
		zap.Int64("flagged_unfinished", res.FlaggedByReason[review.ReasonUnfinishedAtRetention]),
		zap.Int64("flagged_completer_gave_up", res.FlaggedByReason[review.ReasonCompleterGaveUp]),
		zap.Int64("unprocessable_deleted", res.Unprocessable),
		zap.Int("batches", res.Batches),
		zap.Int("batch_timeouts", res.BatchTimeouts),
		zap.Int("locked_batches", res.LockedBatches),
		zap.Int("ordered_batches", res.OrderedBatches),
		zap.Int("concurrent_batches", res.ConcurrentBatches),
		zap.Duration("duration", res.Duration),
		zap.Bool("complete", res.Complete),
		zap.Duration("retention", s.cfg.Retention),
	}
	if res.StopReason != "" {
		fields = append(fields, zap.String("stop_reason", res.StopReason))
	}
	if res.StopDetail != "" {
		fields = append(fields, zap.String("stop_detail", res.StopDetail))
	}
	if res.Throttled > 0 {
		fields = append(fields, zap.Duration("throttled", res.Throttled), zap.String("throttle_reason", res.ThrottleReason))
	}
	if res.Paced > 0 {
		fields = append(fields, zap.Duration("paced", res.Paced))
	}
	if res.WALRate > 0 {
		fields = append(fields, zap.String("wal_rate", throttle.HumanRate(res.WALRate)))
	}
	if res.RequestedCheckpoints > 0 {
		fields = append(fields, zap.Int64("requested_checkpoints", res.RequestedCheckpoints))
	}
	if res.CommitBudget > 0 {
		fields = append(fields, zap.Duration("commit_budget", res.CommitBudget), zap.Int("final_batch_size", res.FinalBatchSize))
	}
	if res.LeaseHolder != "" {
		fields = append(fields, zap.String("lease_holder", res.LeaseHolder))
	}
	if res.TookOverFrom != "" {
		fields = append(fields, zap.String("took_over_from", res.TookOverFrom))
	}
	if !res.LockHeld && !res.DryRun {
		fields = append(fields, zap.String("wal_compression", cmp.Or(res.WALCompression, "server")))
	}
	if res.Plan != nil {
		fields = append(fields, zap.Int64("would_delete", res.Plan.Deletes), zap.Int64("would_flag", res.Plan.Flags))
	}
	return fields, true
}

// Package reaper deletes idempotency keys past the retention window in
// bounded batches, and copies the ones nobody finished into
// idempotency_key_reviews in the same statement that deletes them, so no
// unprocessable key disappears silently (docs/design.md, invariant 4).
//
// A run holds the reaper's lease (internal/lease), renewed inside every
// batch, so runs never overlap whether they come from a CronJob, a manual
// run or a second Deployment, and whatever pooler sits between them and the
// database; a run that finds another live run says so and ends
// successfully, and a run that finds the lease of a dead run waits for it
// to expire and takes over. Each batch is its own transaction on any pooled
// connection, with every setting local to it: a failing batch never undoes
// the work of the batches before it, and nothing outlives a batch on a
// server connection.
package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/robfig/cron/v3"
	"go.uber.org/zap"

	"idemd/internal/lease"
	"idemd/internal/review"
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
	// OrderedBatches found nothing to delete in their created_at range
	// although keys were left (more than a batch of keys share one
	// created_at, or every key in the range is in flight) and were redone
	// in id order.
	OrderedBatches  int
	FinalBatchSize  int
	Duration        time.Duration
	Complete        bool   // nothing eligible was left when the run ended
	StopReason      string // why an incomplete run stopped: max_runtime, shutdown, error
	WouldDelete     int64  // dry run: keys a run would delete now
	WouldFlag       int64  // dry run: reviews a run would create now
	ListedFlagCount int    // dry run: how many of WouldFlag were printed
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

// ErrCapExceeded is returned (wrapped) when a run would delete or flag more
// than --max-deletes or --max-flags.
var ErrCapExceeded = errors.New("per-run cap exceeded")

// Service runs the reaper, once (RunOnce) or on a schedule (Start/Stop).
type Service struct {
	cfg     Config
	logger  *zap.Logger
	metrics *metrics

	// pinnedNow replaces the database's now() in every statement; tests use
	// it to put keys exactly at the horizon. Production leaves it nil.
	pinnedNow *time.Time
	// hooks let tests stop a run at a known point; nil in production.
	hooks testHooks
	// holder names this process in the lease table.
	holder string

	mu      sync.Mutex
	cron    *cron.Cron
	cancel  context.CancelFunc
	started bool
}

type testHooks struct {
	afterLock  func(ctx context.Context)            // the lease is held, no batch yet
	inBatch    func(ctx context.Context, tx pgx.Tx) // a batch's settings are in force, its statement not run yet
	afterBatch func(ctx context.Context, batch int)
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
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, logger: cfg.Logger, metrics: m, holder: lease.Holder("reaper")}, nil
}

// RunOnce does one run: take the lock, reap (or plan, for a dry run), log
// the summary. The Result is never nil, even with an error, so the counts of
// the committed batches are known.
func (s *Service) RunOnce(ctx context.Context) (*Result, error) {
	return s.runOnce(ctx)
}

func (s *Service) runOnce(ctx context.Context) (*Result, error) {
	start := time.Now()
	res := &Result{DryRun: s.cfg.DryRun, FlaggedByReason: map[string]int64{}, FinalBatchSize: s.cfg.BatchSize}
	err := s.run(ctx, res, start)
	res.Duration = time.Since(start)
	s.finish(res, err)
	return res, err
}

func (s *Service) run(ctx context.Context, res *Result, start time.Time) error {
	// A dry run changes nothing, so it needs no lease: an operator
	// previewing while a run is going still gets an answer.
	if s.cfg.DryRun {
		return s.dryRun(ctx, res)
	}
	held, err := s.takeLease(ctx, res)
	if err != nil || !held {
		return err
	}
	defer s.releaseLease(ctx)
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); s.heartbeat(hbCtx) }()
	defer func() { stopHeartbeat(); <-hbDone }()

	if s.hooks.afterLock != nil {
		s.hooks.afterLock(ctx)
	}
	if s.probeWALCompression(ctx) {
		res.WALCompression = s.cfg.WALCompression
	}
	if err := s.checkCaps(ctx); err != nil {
		res.StopReason = "error"
		return err
	}
	return s.reap(ctx, res, start)
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
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT set_config('wal_compression', $1, true)", s.cfg.WALCompression)
		return err
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

// reap deletes batches until one comes back short (nothing eligible left),
// the run's time is up, or the process is shutting down.
func (s *Service) reap(ctx context.Context, res *Result, start time.Time) error {
	size := s.cfg.BatchSize
	var cursor *batchCursor
	for {
		if ctx.Err() != nil {
			res.StopReason = "shutdown"
			return nil
		}
		if time.Since(start) >= s.cfg.MaxRuntime {
			res.StopReason = "max_runtime"
			return nil
		}
		limit := size
		if s.cfg.MaxDeletes > 0 {
			// Take at most one key past the cap: if the batch finds it, keys
			// crossed the horizon during the run beyond what the pre-check
			// allowed, and the batch's own check rolls it back and stops
			// the run. If not, the batch comes back short and the run is
			// complete.
			if left := s.cfg.MaxDeletes - res.Deleted; left+1 < int64(limit) {
				limit = int(left + 1)
			}
		}

		b, err := s.deleteBatch(ctx, limit, cursor, res)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
		case errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil:
			// statement_timeout: the database is slower than the batch size
			// assumes. Halve and retry rather than fail the run, down to a
			// floor below which the problem is not the batch size.
			s.metrics.batchTimeouts.Inc()
			res.BatchTimeouts++
			if size <= minBatchSize {
				res.StopReason = "error"
				return fmt.Errorf("reaper: batch %d timed out after %s even at %d keys: %w", res.Batches+1, s.cfg.StatementTimeout, size, err)
			}
			size = max(size/2, minBatchSize)
			res.FinalBatchSize = size
			s.logger.Warn("batch hit the statement timeout; halving the batch size",
				zap.Duration("statement_timeout", s.cfg.StatementTimeout), zap.Int("batch_size", size))
			continue
		case errors.Is(err, ErrCapExceeded):
			res.StopReason = "error"
			return fmt.Errorf("reaper: batch %d rolled back: %w; the %d keys deleted by earlier batches stay deleted", res.Batches+1, err, res.Deleted)
		case errors.As(err, &pgErr) && pgErr.Code == "23503":
			res.StopReason = "error"
			blocked := &BlockedError{Constraint: pgErr.ConstraintName, Table: pgErr.TableName, Detail: pgErr.Detail, Err: err}
			return fmt.Errorf("reaper: batch %d: %w; the %d keys deleted by earlier batches of this run stay deleted", res.Batches+1, blocked, res.Deleted)
		default:
			res.StopReason = "error"
			if ctx.Err() != nil {
				res.StopReason = "shutdown"
			}
			return fmt.Errorf("reaper: batch %d: %w", res.Batches+1, err)
		}

		if s.hooks.afterBatch != nil {
			s.hooks.afterBatch(ctx, res.Batches)
		}
		if !b.more {
			res.Complete = true
			return nil
		}
		if b.cursor != nil {
			cursor = b.cursor
		}
		if s.cfg.BatchPause > 0 {
			t := time.NewTimer(s.cfg.BatchPause)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

type batchResult struct {
	deleted, unprocessable, flaggedUnfinished, flaggedGaveUp int64
	// cursor is where the next batch starts (after it); nil if this batch
	// took nothing.
	cursor *batchCursor
	// more: eligible keys may be left after the cursor. False when the batch
	// found fewer than its limit: the run is complete.
	more bool
}

// batchCursor is the (created_at, id) of the last key a batch took.
type batchCursor struct {
	createdAt time.Time
	id        int64
}

// rowLockTimeout is how long a fast-path batch waits for a key's row lock
// before it is redone in the form that skips locked keys. Keys past
// retention are almost never locked, so this is paid rarely; it is short
// because the batch holds the row locks of the keys it already deleted
// while it waits.
const rowLockTimeout = 50 * time.Millisecond

// deleteBatch runs one batch in its own transaction: in the fast range form
// first; if that deleted nothing although keys are left (errRangeEmpty),
// in the form that orders by id too; and if either met a key another
// transaction holds locked, in the form that skips locked keys. A SIGTERM
// does not cancel a running batch (it finishes within --statement-timeout
// and the run stops after it); only the statement timeout does.
func (s *Service) deleteBatch(ctx context.Context, limit int, cursor *batchCursor, res *Result) (batchResult, error) {
	b, err := s.tryBatch(ctx, rangeBatchSQL, rowLockTimeout, limit, cursor, res)
	if errors.Is(err, errRangeEmpty) {
		s.metrics.orderedBatches.Inc()
		res.OrderedBatches++
		s.logger.Debug("the range form found nothing to delete before its bound; taking keys in id order", zap.Int("batch", res.Batches+1))
		b, err = s.tryBatch(ctx, orderedBatchSQL, rowLockTimeout, limit, cursor, res)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		s.metrics.lockedBatches.Inc()
		res.LockedBatches++
		s.logger.Debug("batch met a locked key; redoing it skipping locked keys", zap.Int("batch", res.Batches+1))
		b, err = s.tryBatch(ctx, lockingBatchSQL, 0, limit, cursor, res)
	}
	return b, err
}

// errRangeEmpty: the range form deleted nothing although keys are left
// after its bound. Either more than a batch of keys share the cursor's
// created_at (the range before the bound is empty, and repeating it would
// never progress), or every key before the bound is in flight or leased.
// The ordered form handles both: it splits equal created_at by id and
// counts only eligible keys.
var errRangeEmpty = errors.New("range batch deleted nothing before its bound")

// batchSettingsSQL sets a batch transaction's timeouts, its asynchronous
// commit and the server's check for a vanished client.
const batchSettingsSQL = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
       set_config('synchronous_commit', 'off', true), set_config('client_connection_check_interval', '1000', true)`

// tryBatch runs one form of a batch in a transaction. lockTimeout 0 leaves
// lock waits to the statement timeout.
func (s *Service) tryBatch(ctx context.Context, sql string, lockTimeout time.Duration, limit int, cursor *batchCursor, res *Result) (batchResult, error) {
	var b batchResult
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StatementTimeout+10*time.Second)
	defer cancel()
	started := time.Now()

	tx, err := s.cfg.Pool.Begin(bctx)
	if err != nil {
		return b, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(bctx) //nolint:errcheck // a no-op after Commit

	// synchronous_commit off: the commit does not wait for its WAL to reach
	// disk. A batch lost to a server crash rolls back as a whole (the
	// deletions with their reviews) and the next run deletes those keys
	// again, so nothing the reaper promises depends on that wait, while a
	// batch's WAL (megabytes: every first touch of a page after a checkpoint
	// logs the whole page) makes the wait long.
	//
	// Every setting is local to the batch's transaction: behind a
	// transaction-mode pooler a session setting would stay on a server
	// connection the API uses next. client_connection_check_interval lets
	// the server notice a reaper killed while its batch waits on a row lock
	// and roll the batch back then, rather than when the wait ends.
	settings := batchSettingsSQL
	args := []any{fmt.Sprint(s.cfg.StatementTimeout.Milliseconds()), fmt.Sprint(lockTimeout.Milliseconds())}
	if res.WALCompression != "" {
		settings += `, set_config('wal_compression', $3, true)`
		args = append(args, res.WALCompression)
	}
	if _, err := tx.Exec(bctx, settings, args...); err != nil {
		return b, fmt.Errorf("set batch settings: %w", err)
	}
	// The lease fences the batch: its row stays locked until the batch
	// commits, so no other run can take the lease while this batch's
	// deletions are uncommitted, and a run that lost its lease (it stalled
	// past --lease-ttl and another run took over) stops here.
	if err := lease.Renew(bctx, tx, LeaseName, s.holder, s.cfg.LeaseTTL); err != nil {
		return b, err
	}
	if s.hooks.inBatch != nil {
		s.hooks.inBatch(bctx, tx)
	}
	var cursorAt *time.Time
	var cursorID *int64
	if cursor != nil {
		cursorAt, cursorID = &cursor.createdAt, &cursor.id
	}
	var nextAt *time.Time
	var nextID *int64
	err = tx.QueryRow(bctx, sql,
		s.cfg.Retention.Microseconds(), s.cfg.LockWindow.Microseconds(), s.pinnedNow,
		limit, s.cfg.FlaggedBy, cursorAt, review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp, cursorID,
	).Scan(&b.deleted, &b.unprocessable, &b.flaggedUnfinished, &b.flaggedGaveUp, &nextAt, &nextID, &b.more)
	if err != nil {
		return b, err
	}
	if nextAt != nil && nextID != nil {
		b.cursor = &batchCursor{createdAt: *nextAt, id: *nextID}
	}
	if sql == rangeBatchSQL && b.more && b.deleted == 0 {
		return b, errRangeEmpty // rolled back: it changed nothing
	}
	if s.cfg.MaxDeletes > 0 && res.Deleted+b.deleted > s.cfg.MaxDeletes {
		return b, fmt.Errorf("would delete more than --max-deletes %d: %w", s.cfg.MaxDeletes, ErrCapExceeded)
	}
	if s.cfg.MaxFlags > 0 && res.Flagged+b.flaggedUnfinished+b.flaggedGaveUp > s.cfg.MaxFlags {
		return b, fmt.Errorf("would flag more than --max-flags %d keys: %w", s.cfg.MaxFlags, ErrCapExceeded)
	}
	if err := tx.Commit(bctx); err != nil {
		return b, fmt.Errorf("commit: %w", err)
	}

	s.metrics.batchDuration.Observe(time.Since(started).Seconds())
	s.metrics.batches.Inc()
	s.metrics.deleted.Add(float64(b.deleted))
	s.metrics.flagged.WithLabelValues(review.ReasonUnfinishedAtRetention).Add(float64(b.flaggedUnfinished))
	s.metrics.flagged.WithLabelValues(review.ReasonCompleterGaveUp).Add(float64(b.flaggedGaveUp))
	res.Batches++
	res.Deleted += b.deleted
	res.Unprocessable += b.unprocessable
	res.Flagged += b.flaggedUnfinished + b.flaggedGaveUp
	if b.flaggedUnfinished > 0 {
		res.FlaggedByReason[review.ReasonUnfinishedAtRetention] += b.flaggedUnfinished
	}
	if b.flaggedGaveUp > 0 {
		res.FlaggedByReason[review.ReasonCompleterGaveUp] += b.flaggedGaveUp
	}
	s.logger.Debug("batch committed", zap.Int("batch", res.Batches), zap.Int64("deleted", b.deleted),
		zap.Int64("flagged", b.flaggedUnfinished+b.flaggedGaveUp), zap.Duration("duration", time.Since(started)))
	return b, nil
}

// plan counts the eligible keys and the reviews they would need. limit
// bounds the count (nil: count everything).
func (s *Service) plan(ctx context.Context, limit *int64) (deletes, flags int64, err error) {
	err = s.cfg.Pool.QueryRow(ctx, planSQL,
		s.cfg.Retention.Microseconds(), s.cfg.LockWindow.Microseconds(), s.pinnedNow,
		limit, review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp,
	).Scan(&deletes, &flags)
	if err != nil {
		return 0, 0, fmt.Errorf("reaper: plan: %w", err)
	}
	return deletes, flags, nil
}

// checkCaps refuses a run that would exceed --max-deletes or --max-flags
// before it deletes anything. The count stops one past the delete cap, so
// it costs no more than the run it guards.
func (s *Service) checkCaps(ctx context.Context) error {
	if s.cfg.MaxDeletes == 0 && s.cfg.MaxFlags == 0 {
		return nil
	}
	var limit *int64
	if s.cfg.MaxDeletes > 0 {
		l := s.cfg.MaxDeletes + 1
		limit = &l
	}
	deletes, flags, err := s.plan(ctx, limit)
	if err != nil {
		return err
	}
	if s.cfg.MaxDeletes > 0 && deletes > s.cfg.MaxDeletes {
		return fmt.Errorf("reaper: more than %d keys are past retention, the --max-deletes cap; nothing was deleted (check --retention, or raise the cap): %w", s.cfg.MaxDeletes, ErrCapExceeded)
	}
	if s.cfg.MaxFlags > 0 && flags > s.cfg.MaxFlags {
		return fmt.Errorf("reaper: %d keys past retention would be flagged for review, more than the --max-flags cap %d; nothing was deleted (is the completer running?): %w", flags, s.cfg.MaxFlags, ErrCapExceeded)
	}
	return nil
}

// dryRunListLimit bounds the keys a dry run prints one by one.
const dryRunListLimit = 100

// dryRun reports what a run would do now, changing nothing.
func (s *Service) dryRun(ctx context.Context, res *Result) error {
	deletes, flags, err := s.plan(ctx, nil)
	if err != nil {
		return err
	}
	res.WouldDelete, res.WouldFlag = deletes, flags
	res.Complete = true

	rows, err := s.cfg.Pool.Query(ctx, planFlagsSQL,
		s.cfg.Retention.Microseconds(), s.cfg.LockWindow.Microseconds(), s.pinnedNow,
		dryRunListLimit, review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp)
	if err != nil {
		return fmt.Errorf("reaper: dry run list: %w", err)
	}
	type flagRow struct {
		id, userID         int64
		key, point, reason string
		createdAt          time.Time
	}
	var list []flagRow
	for rows.Next() {
		var r flagRow
		if err := rows.Scan(&r.id, &r.userID, &r.key, &r.point, &r.createdAt, &r.reason); err != nil {
			rows.Close()
			return fmt.Errorf("reaper: dry run list: %w", err)
		}
		list = append(list, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reaper: dry run list: %w", err)
	}
	res.ListedFlagCount = len(list)

	out := s.cfg.Stdout
	fmt.Fprintf(out, "dry run: nothing was changed\n")
	fmt.Fprintf(out, "would delete %d keys older than %s (locked keys and keys leased by the completer are skipped)\n", deletes, s.cfg.Retention)
	fmt.Fprintf(out, "would flag %d keys for review\n", flags)
	if s.cfg.MaxDeletes > 0 && deletes > s.cfg.MaxDeletes {
		fmt.Fprintf(out, "a real run would refuse: %d exceeds --max-deletes %d\n", deletes, s.cfg.MaxDeletes)
	}
	if s.cfg.MaxFlags > 0 && flags > s.cfg.MaxFlags {
		fmt.Fprintf(out, "a real run would refuse: %d exceeds --max-flags %d\n", flags, s.cfg.MaxFlags)
	}
	if len(list) > 0 {
		fmt.Fprintf(out, "keys that would be flagged (oldest first")
		if int64(len(list)) < flags {
			fmt.Fprintf(out, ", first %d of %d", len(list), flags)
		}
		fmt.Fprintf(out, "):\n")
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY_ID\tUSER_ID\tIDEMPOTENCY_KEY\tRECOVERY_POINT\tCREATED_AT\tREASON")
		for _, r := range list {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", r.id, r.userID, r.key, r.point, r.createdAt.UTC().Format(time.RFC3339), r.reason)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("reaper: dry run output: %w", err)
		}
	}
	return nil
}

// finish records the run in metrics, readiness and the one summary line.
func (s *Service) finish(res *Result, err error) {
	outcome := outcomeComplete
	switch {
	case err != nil:
		outcome = outcomeError
	case res.LockHeld:
		outcome = outcomeLockHeld
	case res.DryRun:
		outcome = outcomeDryRun
	case !res.Complete:
		outcome = outcomeIncomplete
	}
	s.metrics.runs.WithLabelValues(outcome).Inc()
	if !res.LockHeld {
		s.metrics.runDuration.Observe(res.Duration.Seconds())
	}
	if err == nil {
		if outcome == outcomeComplete {
			s.metrics.lastSuccess.SetToCurrentTime()
		}
		if s.cfg.Ready != nil {
			s.cfg.Ready.MarkPass(time.Now())
		}
	}

	fields := []zap.Field{
		zap.String("result", outcome),
		zap.Int64("deleted", res.Deleted),
		zap.Int64("flagged", res.Flagged),
		zap.Int64("flagged_unfinished", res.FlaggedByReason[review.ReasonUnfinishedAtRetention]),
		zap.Int64("flagged_completer_gave_up", res.FlaggedByReason[review.ReasonCompleterGaveUp]),
		zap.Int64("unprocessable_deleted", res.Unprocessable),
		zap.Int("batches", res.Batches),
		zap.Int("batch_timeouts", res.BatchTimeouts),
		zap.Int("locked_batches", res.LockedBatches),
		zap.Int("ordered_batches", res.OrderedBatches),
		zap.Duration("duration", res.Duration),
		zap.Bool("complete", res.Complete),
		zap.Duration("retention", s.cfg.Retention),
	}
	if res.StopReason != "" {
		fields = append(fields, zap.String("stop_reason", res.StopReason))
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
	if res.DryRun {
		fields = append(fields, zap.Int64("would_delete", res.WouldDelete), zap.Int64("would_flag", res.WouldFlag))
	}
	if err != nil {
		s.logger.Error("reaper run summary", append(fields, zap.Error(err))...)
		return
	}
	s.logger.Info("reaper run summary", fields...)
}

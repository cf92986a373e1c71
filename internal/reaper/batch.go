package reaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/review"
)

// batchForm is one of the three statements a batch can take (sql.go), and
// how long it waits for a key's row lock.
type batchForm struct {
	name        string
	sql         string
	lockTimeout time.Duration // 0: lock waits are left to the statement timeout
}

// rowLockTimeout is how long a batch in the range or ordered form waits for
// a key's row lock before it is redone in the form that skips locked keys.
// Keys past retention are almost never locked, so this is paid rarely; it
// is short because the batch holds the row locks of the keys it already
// deleted while it waits.
const rowLockTimeout = 50 * time.Millisecond

var (
	rangeForm   = batchForm{name: "range", sql: rangeBatchSQL, lockTimeout: rowLockTimeout}
	orderedForm = batchForm{name: "ordered", sql: orderedBatchSQL, lockTimeout: rowLockTimeout}
	lockingForm = batchForm{name: "locking", sql: lockingBatchSQL}
)

// batchJob is what one batch is asked to do.
type batchJob struct {
	run       int64        // the run's row in idemd_reaper_runs
	batchSize int          // keys it may delete (@batch_size)
	cursor    *batchCursor // where it starts (after); nil: from the oldest key
	// until, in a concurrent round, is where the next batch of the round
	// starts: this batch takes only keys created before it (the range form
	// only). nil: the batch finds its own end.
	until *time.Time
	// deleted and flagged by the run's committed batches, for the caps.
	deleted, flagged int64
	// walCompression of its transaction; empty: the server's.
	walCompression string
}

// batchCursor is the (created_at, id) of the last key a batch took.
type batchCursor struct {
	createdAt time.Time
	id        int64
}

type batchResult struct {
	deleted, unprocessable, flaggedUnfinished, flaggedGaveUp int64
	// cursor is where the next batch starts (after it); nil if this batch
	// took nothing.
	cursor *batchCursor
	// more: eligible keys may be left after the cursor. False when the batch
	// found fewer than its batch size: the run is complete.
	more     bool
	duration time.Duration
	// ordered: the range form found nothing and the batch was redone in
	// id order; locked: it met a locked key and was redone skipping
	// locked keys; concurrent: it ran in a round beside other batches.
	ordered, locked, concurrent bool
}

func (b batchResult) flagged() int64 { return b.flaggedUnfinished + b.flaggedGaveUp }

// runBatch is the unit of a pass: one batch, in its own transaction. It
// runs in the fast range form first; if that deleted nothing although keys
// are left (errRangeEmpty), in the form that orders by id too; and if
// either met a key another transaction holds locked, in the form that
// skips locked keys. A stop
// request does not cancel a running batch (it finishes within
// --statement-timeout and the run stops after it); ctx ending and the
// statement timeout do.
func (s *Service) runBatch(ctx context.Context, job batchJob) (batchResult, error) {
	ordered, locked := false, false
	b, err := s.tryBatch(ctx, rangeForm, job)
	if errors.Is(err, errRangeEmpty) {
		s.metrics.orderedBatches.Inc()
		ordered = true
		s.logger.Debug("the range form found nothing to delete before its bound; taking keys in id order", zap.Int64("deleted_so_far", job.deleted))
		b, err = s.tryBatch(ctx, orderedForm, job)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
		s.metrics.lockedBatches.Inc()
		locked = true
		s.logger.Debug("batch met a locked key; redoing it skipping locked keys", zap.Int64("deleted_so_far", job.deleted))
		b, err = s.tryBatch(ctx, lockingForm, job)
	}
	b.ordered, b.locked = ordered, locked
	return b, err
}

// errRangeEmpty: the range form deleted nothing although keys are left
// after its bound. Either more than a batch of keys share the cursor's
// created_at (the range before the bound is empty, and repeating it would
// never progress), or every key before the bound is in flight or leased.
// The ordered form handles both: it splits equal created_at by id and
// counts only eligible keys.
var errRangeEmpty = errors.New("range batch deleted nothing before its bound")

// tryBatch runs one form of a batch in a transaction and commits it when
// checkBatch accepts what it did: one call bounded by --statement-timeout
// (the server's, SET LOCAL, which ends a slow batch with an error that
// halves the next) and --database-timeout for the rest.
func (s *Service) tryBatch(ctx context.Context, form batchForm, job batchJob) (b batchResult, err error) {
	err = s.cfg.Calls.DoStatement(ctx, "reaper batch", s.cfg.StatementTimeout, func(ctx context.Context) (err error) {
		b, err = s.batchTx(ctx, form, job)
		return err
	})
	return b, err
}

func (s *Service) batchTx(bctx context.Context, form batchForm, job batchJob) (batchResult, error) {
	started := time.Now()

	tx, err := s.cfg.Pool.Begin(bctx)
	if err != nil {
		return batchResult{}, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		cctx, cancel := s.cfg.Calls.Cleanup(bctx)
		defer cancel()
		tx.Rollback(cctx) //nolint:errcheck // a no-op after Commit
	}()

	if err := s.beginBatch(bctx, tx, form.lockTimeout, job.walCompression); err != nil {
		return batchResult{}, err
	}
	if s.hooks.inBatch != nil {
		s.hooks.inBatch(bctx, tx)
	}
	b, err := s.execBatch(bctx, tx, form, job)
	if err != nil {
		return b, err
	}
	if err := checkBatch(&s.cfg.Settings, form, job, b); err != nil {
		return b, err // rolled back
	}
	if err := recordBatch(bctx, tx, job.run, b); err != nil {
		return b, err
	}
	if err := tx.Commit(bctx); err != nil {
		return b, fmt.Errorf("commit: %w", err)
	}
	b.duration = time.Since(started)
	return b, nil
}

// batchSettingsSQL sets a batch transaction's timeouts, its asynchronous
// commit and the server's check for a vanished client.
const batchSettingsSQL = `SELECT set_config('statement_timeout', @statement_timeout, true), set_config('lock_timeout', @lock_timeout, true),
       set_config('synchronous_commit', 'off', true), set_config('client_connection_check_interval', '1000', true)`

// beginBatch puts a batch transaction's settings in force and fences it
// with the run's lease.
//
// synchronous_commit off: the commit does not wait for its WAL to reach
// disk. A batch lost to a server crash rolls back as a whole (the deletions
// with their reviews) and the next run deletes those keys again, so nothing
// the reaper promises depends on that wait, while a batch's WAL (megabytes:
// every first touch of a page after a checkpoint logs the whole page) makes
// the wait long.
//
// Every setting is local to the batch's transaction: behind a
// transaction-mode pooler a session setting would stay on a server
// connection the API uses next. client_connection_check_interval lets the
// server notice a reaper killed while its batch waits on a row lock and
// roll the batch back then, rather than when the wait ends.
func (s *Service) beginBatch(ctx context.Context, tx pgx.Tx, lockTimeout time.Duration, walCompression string) error {
	settings := batchSettingsSQL
	args := pgx.NamedArgs{
		"statement_timeout": fmt.Sprint(s.cfg.StatementTimeout.Milliseconds()),
		"lock_timeout":      fmt.Sprint(lockTimeout.Milliseconds()),
	}
	if walCompression != "" {
		settings += `, set_config('wal_compression', @wal_compression, true)`
		args["wal_compression"] = walCompression
	}
	if _, err := tx.Exec(ctx, settings, args); err != nil {
		return fmt.Errorf("set batch settings: %w", err)
	}
	// The lease fences the batch: its row stays share-locked until the
	// batch commits, so no other run can take the lease while this batch's
	// deletions are uncommitted, and a run that lost its lease (it stalled
	// past --lease-ttl and another run took over) stops here. A share lock,
	// so the batches of one round do not wait for each other; the run
	// renews the lease before each round (reap).
	return lease.Fence(ctx, tx, LeaseName, s.holder)
}

// execBatch runs the batch's statement.
func (s *Service) execBatch(ctx context.Context, tx pgx.Tx, form batchForm, job batchJob) (batchResult, error) {
	var b batchResult
	var nextAt *time.Time
	var nextID *int64
	err := tx.QueryRow(ctx, form.sql, s.batchArgs(job)).
		Scan(&b.deleted, &b.unprocessable, &b.flaggedUnfinished, &b.flaggedGaveUp, &nextAt, &nextID, &b.more)
	if err != nil {
		return b, err
	}
	if nextAt != nil && nextID != nil {
		b.cursor = &batchCursor{createdAt: *nextAt, id: *nextID}
	}
	return b, nil
}

// checkBatch decides whether a batch may commit: not a range batch that
// found its range empty although keys are left (errRangeEmpty: it changed
// nothing, and the ordered form must redo it), and not one that takes the
// run past --max-deletes or --max-flags (ErrCapExceeded).
func checkBatch(s *Settings, form batchForm, job batchJob, b batchResult) error {
	if form.name == rangeForm.name && b.more && b.deleted == 0 {
		return errRangeEmpty
	}
	if s.MaxDeletes > 0 && job.deleted+b.deleted > s.MaxDeletes {
		return fmt.Errorf("would delete more than --max-deletes %d: %w", s.MaxDeletes, ErrCapExceeded)
	}
	if s.MaxFlags > 0 && job.flagged+b.flagged() > s.MaxFlags {
		return fmt.Errorf("would flag more than --max-flags %d keys: %w", s.MaxFlags, ErrCapExceeded)
	}
	return nil
}

// eligibilityArgs are the parameters every statement shares (sql.go).
func eligibilityArgs(e Eligibility, now *time.Time) pgx.NamedArgs {
	return pgx.NamedArgs{
		"retention":   e.Retention,
		"lock_window": e.LockWindow,
		"now":         now,
		"unfinished":  review.ReasonUnfinishedAtRetention,
		"gave_up":     review.ReasonCompleterGaveUp,
	}
}

// batchArgs are a batch statement's parameters.
func (s *Service) batchArgs(job batchJob) pgx.NamedArgs {
	args := eligibilityArgs(s.cfg.Eligibility, s.pinnedNow)
	args["batch_size"] = job.batchSize
	args["flagged_by"] = s.cfg.FlaggedBy
	args["cursor_at"], args["cursor_id"] = nil, nil
	if job.cursor != nil {
		args["cursor_at"], args["cursor_id"] = job.cursor.createdAt, job.cursor.id
	}
	args["until"] = job.until
	return args
}

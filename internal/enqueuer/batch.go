package enqueuer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/riverdb"
)

// batchResult is what one batch did.
type batchResult struct {
	moved        int // rows that became River jobs, or duplicates of a unique one
	duplicates   int // of moved, rows whose unique job River already had (or the batch had)
	deadLettered int // rows moved to staged_jobs_dead
	taken        int // rows taken from staged_jobs (moved + deadLettered)
	last         int64
	// full: the batch took --batch-size rows, so more may be waiting.
	full bool
}

// runBatch moves one batch of a drain in one transaction: rows from the
// drain's cursor on. Rows taken with ids below spec.gapBelow are counted as
// a notification gap.
func (s *Service) runBatch(ctx context.Context, cur *cursor, spec drainSpec) (*batchResult, error) {
	start := time.Now()
	version, err := s.riverVersion(ctx)
	if err != nil {
		// River's schema is one the enqueuer does not write (or could not
		// be read): nothing is taken, the rows wait staged.
		s.metrics.batchErrors.Inc()
		s.batchFailed(err, math.MaxInt64)
		return nil, err
	}
	from := cur.claim(s.cfg.BatchSize)
	res, err := s.serverBatch(ctx, from, spec.gapBelow, version)
	if err == nil && res == nil {
		// The batch holds a row the server-side move does not take: the Go
		// path takes a batch again and dead-letters that row with its
		// reason.
		res, err = s.moveBatch(ctx, from, spec.gapBelow, false, version)
	}
	if errors.Is(err, errRiverRejected) {
		// The batch was rolled back whole: its rows are back in staged_jobs.
		// Take a batch again and insert it one savepoint per row, so only the
		// offending rows are dead-lettered. (It may be other rows, if
		// another replica took these meanwhile; any bad row among them is
		// found the same way.)
		s.logger.Warn("river rejected a batch; redoing it row by row", zap.Error(err))
		res, err = s.moveBatch(ctx, from, spec.gapBelow, true, version)
	}
	s.metrics.batchDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.batchErrors.Inc()
		s.batchFailed(err, from)
		return nil, err
	}
	s.batchCommitted(from)
	s.metrics.moved.Add(float64(res.moved - res.duplicates))
	s.metrics.uniqueDuplicates.Add(float64(res.duplicates))
	if res.taken > 0 {
		for p := s.takenUpTo.Load(); res.last > p && !s.takenUpTo.CompareAndSwap(p, res.last); p = s.takenUpTo.Load() {
		}
	}
	res.full = res.taken >= s.cfg.BatchSize
	if res.full {
		cur.passed(res.last)
	}
	// Every committed batch is progress: a drain of a huge backlog must not
	// look stale to /readyz while it is working.
	s.MarkReady(time.Now())
	return res, nil
}

// errRiverRejected: River refused the batch's insert for a reason in the
// data that validation did not foresee; the batch is redone row by row.
var errRiverRejected = errors.New("river rejected the batch")

// serverBatch moves one batch in one round trip (moveInServer). It
// returns nil and no error when the batch holds a row that only the Go
// path, moveBatch, can deal with: one to dead-letter.
func (s *Service) serverBatch(ctx context.Context, from, gapBelow int64, riverVersion int) (*batchResult, error) {
	r, err := s.moveInServer(ctx, from, gapBelow, riverVersion)
	if err != nil {
		return nil, err
	}
	if !r.riverCurrent {
		// A River migration ran since the gate's last read: read it again
		// before anything is written.
		s.riverGate.invalidate()
		return nil, fmt.Errorf("enqueuer batch: %w: River's schema is no longer at version %d", errRiverSchema, riverVersion)
	}
	if r.invalid > 0 {
		return nil, nil
	}
	res := &batchResult{moved: r.moved, duplicates: r.duplicates, taken: r.locked, last: fullPass}
	if r.locked > 0 {
		res.last = r.last
	}
	s.gap(GapSwept, r.gaps, zap.Int64("lowest_staged_id", r.lowestGap), zap.Int("rows", r.gaps))
	return res, nil
}

// moveBatch is the Go path: it takes, inserts through River's client and
// deletes one batch in one transaction, dead-lettering the rows validation
// or River refuses. rowByRow inserts each job under its own savepoint, so
// a job River rejects is dead-lettered alone; otherwise the batch goes to
// River in one statement (insertMany).
//
// Each step is a call bounded by --database-timeout (the take, the
// insert or each row's, the dead letters, the commit): the row-by-row
// path's round trips grow with the batch, and a bound on the whole would
// fail a large batch on a slow link every time.
func (s *Service) moveBatch(ctx context.Context, from, gapBelow int64, rowByRow bool, riverVersion int) (*batchResult, error) {
	var tx pgx.Tx
	var staged []riverdb.StagedRow
	err := s.calls.Do(ctx, batchOp, func(ctx context.Context) (err error) {
		tx, staged, err = s.beginTake(ctx, from, riverVersion)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := s.calls.Cleanup(ctx)
		defer cancel()
		tx.Rollback(cctx) //nolint:errcheck // no-op after commit
	}()

	res := &batchResult{taken: len(staged), last: fullPass}
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
	good := make([]*riverdb.StagedRow, 0, len(staged))
	var dead []deadRow
	// Of the rows with one unique key the first (lowest id) is inserted
	// and the others are its duplicates, as in riverdb.MoveSQL: River's insert of
	// both in one statement would fail the batch.
	var uniques map[string]bool
	for i := range staged {
		r := &staged[i]
		if bad := s.valid.Check(r); bad != nil {
			dead = append(dead, deadRow{row: r, why: bad})
			continue
		}
		if r.UniqueKey != nil {
			if uniques == nil {
				uniques = make(map[string]bool)
			}
			if uniques[string(r.UniqueKey)] {
				res.duplicates++
				continue
			}
			uniques[string(r.UniqueKey)] = true
		}
		p, err := riverdb.InsertParams(r)
		if err != nil {
			dead = append(dead, deadRow{row: r, why: &riverdb.Invalid{Code: riverdb.ReasonInvalidMeta, Detail: err.Error()}})
			continue
		}
		params = append(params, p)
		good = append(good, r)
	}

	sortByUniqueKey(params, good)
	moved, dups, more, err := s.insertRows(ctx, tx, params, good, rowByRow)
	if err != nil {
		return nil, err
	}
	res.duplicates += dups
	dead = append(dead, more...)
	err = s.calls.Do(ctx, batchOp, func(ctx context.Context) error {
		if err := insertDead(ctx, tx, dead); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("enqueuer batch: commit: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.moved = moved + res.duplicates - dups
	res.deadLettered = len(dead)
	s.gap(GapSwept, gaps, zap.Int64("lowest_staged_id", lowestGap), zap.Int("rows", gaps))
	for _, d := range dead {
		s.metrics.deadLettered.WithLabelValues(d.why.Code).Inc()
		s.logger.Warn("staged job dead-lettered",
			zap.Int64("staged_id", d.row.ID), zap.String("kind", d.row.Kind),
			zap.String("reason", d.why.Code), zap.String("detail", d.why.Detail))
	}
	return res, nil
}

// insertRows inserts params into River on tx, all at once or, rowByRow,
// each under its own savepoint so only the rows River rejects are
// dead-lettered. It returns the rows inserted or found as unique
// duplicates, how many of those were duplicates, and the rows River
// rejected. A rejection of the whole batch returns errRiverRejected;
// errors that are not about the data (connection lost, serialization)
// fail the batch and it is retried whole. A refusal that is the table's
// and not the row's fails the batch too, even for a lone row, and
// dead-letters nothing (tableRefusal): otherwise a column or constraint
// added to river_job by hand would empty staged_jobs into
// staged_jobs_dead. So does an insert that wrote fewer jobs than it was
// given (errJobsDropped).
func (s *Service) insertRows(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams, rows []*riverdb.StagedRow, rowByRow bool) (moved, dups int, dead []deadRow, err error) {
	if len(params) == 0 {
		return 0, 0, nil, nil
	}
	if !rowByRow {
		var n, d int
		err := s.calls.Do(ctx, batchOp, func(ctx context.Context) (err error) {
			n, d, err = s.insertMany(ctx, tx, params)
			return err
		})
		if err == nil {
			return n, d, nil, nil
		}
		if !errors.Is(err, errJobsDropped) && isDataError(err, tx.Conn()) {
			return 0, 0, nil, fmt.Errorf("enqueuer batch: %w: %w", errRiverRejected, err)
		}
		return 0, 0, nil, fmt.Errorf("enqueuer batch: insert into river: %w", err)
	}
	var refusals []*pgconn.PgError // the database's refusals; River's own validation errors are not
	for i := range params {
		var rejected error // River refused the row
		var d int
		err := s.calls.Do(ctx, batchOp, func(ctx context.Context) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return fmt.Errorf("enqueuer batch: savepoint: %w", err)
			}
			if _, d, err = s.insertMany(ctx, sp, params[i:i+1]); err != nil {
				if errors.Is(err, errJobsDropped) || !isDataError(err, tx.Conn()) {
					return fmt.Errorf("enqueuer batch: insert into river: %w", err)
				}
				if err := sp.Rollback(ctx); err != nil {
					return fmt.Errorf("enqueuer batch: rollback savepoint: %w", err)
				}
				rejected = err
				return nil
			}
			if err := sp.Commit(ctx); err != nil {
				return fmt.Errorf("enqueuer batch: release savepoint: %w", err)
			}
			return nil
		})
		if err != nil {
			return 0, 0, nil, err
		}
		if rejected != nil {
			var pgErr *pgconn.PgError
			if errors.As(rejected, &pgErr) {
				if pgErr.Code == "23502" {
					// River's insert writes every column it knows a
					// value for: a NOT NULL violation is a column added
					// to river_job, which refuses every row.
					s.riverGate.invalidate()
					return 0, 0, nil, fmt.Errorf("enqueuer batch: %w: a NOT NULL column River does not write (SQLSTATE 23502); "+
						"nothing is dead-lettered, the rows stay staged: %w", errTableRefused, rejected)
				}
				refusals = append(refusals, pgErr)
			}
			dead = append(dead, deadRow{row: rows[i], why: &riverdb.Invalid{Code: riverdb.ReasonRejectedByRiver, Detail: rejected.Error()}})
			continue
		}
		moved++
		dups += d
	}
	if moved == 0 && len(refusals) > 0 {
		if err := s.tableRefusal(ctx, tx, len(params), refusals); err != nil {
			return 0, 0, nil, err
		}
	}
	return moved, dups, dead, nil
}

// tableRefusal decides whether River's table refusing rows, of n tried
// one by one with none taken, is the table's fault (a column, constraint
// or trigger added by hand) and not the rows': every row of several
// refused with one SQLSTATE, or a known-good job refused too (probeTable),
// which is how a lone row is judged. It returns the batch's error then
// (wrapping errTableRefused, or errJobsDropped), and nil when the rows are
// to blame: the table takes other jobs. The gate reads River's schema
// again at the next batch.
func (s *Service) tableRefusal(ctx context.Context, tx pgx.Tx, n int, refusals []*pgconn.PgError) error {
	if code, ok := tableFault(n, refusals); ok {
		s.riverGate.invalidate()
		return fmt.Errorf("enqueuer batch: %w: it refused all %d rows of the batch with SQLSTATE %s: a fault of river_job, not of the rows; "+
			"nothing is dead-lettered, the rows stay staged (first refusal: %w)", errTableRefused, n, code, refusals[0])
	}
	var refused error
	err := s.calls.Do(ctx, batchOp, func(ctx context.Context) (err error) {
		refused, err = s.probeTable(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	if refused == nil {
		return nil
	}
	s.riverGate.invalidate()
	if errors.Is(refused, errJobsDropped) {
		return fmt.Errorf("enqueuer batch: insert into river: %w (a known-good job was dropped)", refused)
	}
	return fmt.Errorf("enqueuer batch: %w: a known-good job is refused too (%w); "+
		"nothing is dead-lettered, the rows stay staged (the rows' refusal: %s)", errTableRefused, refused, refusals[0].Error())
}

// tableFault reports whether River's table refusing rows with the given
// errors, out of n rows tried one by one, is a fault of the table: every
// row of several refused with the same code. A lone row is judged by the
// probe instead.
func tableFault(n int, refusals []*pgconn.PgError) (string, bool) {
	if n < 2 || len(refusals) != n {
		return "", false
	}
	for _, r := range refusals[1:] {
		if r.Code != refusals[0].Code {
			return "", false
		}
	}
	return refusals[0].Code, true
}

// sortByUniqueKey puts the unique rows of a batch in unique-key order,
// params and rows alike, and the others after them. Every replica then
// takes River's unique-key locks (its ON CONFLICT's) in one order, so
// two batches with keys in common wait for one another but never
// deadlock; in id order they did (40P01), ids and keys being unrelated.
// riverdb.MoveSQL inserts in the same order.
func sortByUniqueKey(params []river.InsertManyParams, rows []*riverdb.StagedRow) {
	if !anyUnique(params) {
		return
	}
	idx := make([]int, len(params))
	for i := range idx {
		idx[i] = i
	}
	key := func(i int) []byte { return rows[i].UniqueKey }
	slices.SortStableFunc(idx, func(a, b int) int {
		ka, kb := key(a), key(b)
		switch {
		case ka == nil && kb == nil:
			return 0
		case ka == nil:
			return 1
		case kb == nil:
			return -1
		}
		return bytes.Compare(ka, kb)
	})
	p2, r2 := slices.Clone(params), slices.Clone(rows)
	for i, j := range idx {
		params[i], rows[i] = p2[j], r2[j]
	}
}

// copyMinRows: on the Go path, a batch of at least this many rows goes
// into River with COPY, a smaller one with one INSERT. COPY is two round
// trips (the command, then its data) and an INSERT one: for a few rows the
// round trip is most of the cost (docs/benchmarks/load.md), while a batch
// from a backlog that holds a row to dead-letter has COPY's cheaper rows.
const copyMinRows = 64

// insertMany inserts params into River on tx, validated and encoded by
// River either way, and returns how many rows it inserted or found as
// unique duplicates, and how many of those were duplicates; an error
// wrapping errJobsDropped when River's table wrote fewer.
func (s *Service) insertMany(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) (int, int, error) {
	if len(params) >= copyMinRows && !anyUnique(params) {
		n, err := s.river.InsertManyFastTx(ctx, tx, params)
		if err == nil && n != len(params) {
			err = fmt.Errorf("%w: %d staged rows taken but %d River jobs written", errJobsDropped, len(params), n)
		}
		return n, 0, err
	}
	res, err := s.river.InsertManyTx(ctx, tx, params)
	if err != nil {
		return 0, 0, err
	}
	dups := 0
	for _, r := range res {
		if r.UniqueSkippedAsDuplicate {
			dups++
		}
	}
	if len(res) != len(params) {
		// River's insert returns a row for each job it wrote or found; a
		// trigger or rule that drops an insert returns none. The caller
		// fails the batch, so the rows stay staged (riverdb.MoveSQL's
		// idemd_move_check, on the Go path).
		return 0, 0, fmt.Errorf("%w: %d staged rows taken but %d River jobs written or found", errJobsDropped, len(params), len(res))
	}
	return len(res), dups, nil
}

// anyUnique: one of params carries a unique key. River's fast insert does
// not say which rows were duplicates.
func anyUnique(params []river.InsertManyParams) bool {
	for _, p := range params {
		if a, ok := p.Args.(riverdb.StagedArgs); ok && a.UniqueKey != nil {
			return true
		}
	}
	return false
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

type deadRow struct {
	row *riverdb.StagedRow
	why *riverdb.Invalid
}

func insertDead(ctx context.Context, tx pgx.Tx, dead []deadRow) error {
	if len(dead) == 0 {
		return nil
	}
	// Few rows, rarely: a plain batch of inserts is simplest and clearest.
	batch := &pgx.Batch{}
	for _, d := range dead {
		batch.Queue(deadSQL, deadArgs(d))
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

// beginTake begins a Go-path move transaction and takes up to
// --batch-size rows from `from`, returning them read. On error nothing is
// held.
func (s *Service) beginTake(ctx context.Context, from int64, riverVersion int) (tx pgx.Tx, staged []riverdb.StagedRow, err error) {
	if tx, err = s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: moveBeginSQL}); err != nil {
		return nil, nil, fmt.Errorf("enqueuer batch: begin: %w", err)
	}
	// The gate's check in this transaction, as riverdb.MoveSQL makes it in its
	// statement: river_job locked against River's migrations (which lock
	// it ACCESS EXCLUSIVE) before the version is read, so the version read
	// is the one the inserts meet.
	var version int
	if _, err = tx.Exec(ctx, riverdb.LockSQL); err == nil {
		err = tx.QueryRow(ctx, riverdb.VersionSQL).Scan(&version)
	}
	if err != nil {
		s.rollback(ctx, tx)
		return nil, nil, fmt.Errorf("enqueuer batch: river schema version: %w", err)
	}
	if version != riverVersion {
		s.rollback(ctx, tx)
		s.riverGate.invalidate()
		return nil, nil, fmt.Errorf("enqueuer batch: %w: River's schema is at version %d, not %d", errRiverSchema, version, riverVersion)
	}
	rows, err := tx.Query(ctx, takeSQL, takeArgs(from, s.cfg.BatchSize))
	if err != nil {
		s.rollback(ctx, tx)
		return nil, nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	if staged, err = s.scanTaken(rows); err != nil {
		s.rollback(ctx, tx)
		return nil, nil, err
	}
	return tx, staged, nil
}

// batchOp is the operation a move transaction's calls are counted under
// when they run out of their bound (idemd_database_call_timeouts_total).
const batchOp = "enqueuer batch"

// rollback ends tx after a failure, within its own bound: the call that
// failed may have been cut short, and a shutdown must still roll back.
func (s *Service) rollback(ctx context.Context, tx pgx.Tx) {
	cctx, cancel := s.calls.Cleanup(ctx)
	defer cancel()
	tx.Rollback(cctx) //nolint:errcheck // the caller's error is the one to report
}

// scanTaken reads the take's rows and closes them.
func (s *Service) scanTaken(rows pgx.Rows) ([]riverdb.StagedRow, error) {
	defer rows.Close()
	// Grown as rows come: a slice of --batch-size rows (760 kB at the
	// default) allocated and zeroed per transaction was most of the
	// process's CPU, in the garbage collector, when every move took this
	// path.
	staged := make([]riverdb.StagedRow, 0, min(s.cfg.BatchSize, 64))
	for rows.Next() {
		var r riverdb.StagedRow
		if err := rows.Scan(&r.ID, &r.CreatedAt, &r.Kind, &r.Args, &r.Queue, &r.Priority, &r.MaxAttempts, &r.ScheduledAt, &r.Tags, &r.Metadata,
			&r.UniqueKey, &r.UniqueStates); err != nil {
			return nil, fmt.Errorf("enqueuer batch: scan: %w", err)
		}
		staged = append(staged, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	return staged, nil
}

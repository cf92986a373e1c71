package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A move's BEGIN goes to the server in the same round trip as its take.
//
// pgx begins a transaction with a round trip of its own, so a move was
// four: BEGIN, the take, River's insert and COMMIT, and a poll that found
// nothing three. Under a stream of commits the drainer polls every few
// milliseconds, and each round trip is a wake-up of this process and of
// its backend that waits for a core the API's backends are busy on: on the
// staging benchmark's two shared cores, the drainer's round trips, not the
// database's work, were most of a row's time from its commit to River
// (docs/benchmarks/enqueuer.md). Sent as one pipeline, BEGIN, the
// session settings and the take cost one round trip, and the move goes on
// in a pgx.Tx that wraps the connection (movingTx).

// moveBegin is moveBeginSQL one statement at a time, as a pipeline sends
// them.
var moveBegin = strings.Split(moveBeginSQL, "; ")

// beginTake begins a move transaction and takes up to --batch-size rows
// from `from`, returning them read. The normal move sends BEGIN, the
// session settings and the take in one pipeline; rowByRow, which needs
// savepoints, begins a pgx transaction first (a round trip more, on a path
// taken only when River rejected a batch). On error nothing is held.
func (s *Service) beginTake(ctx context.Context, from int64, rowByRow bool) (tx pgx.Tx, staged []stagedRow, err error) {
	defer func() {
		if err != nil && tx != nil {
			tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the error is err
		}
	}()
	if rowByRow {
		if tx, err = s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: moveBeginSQL}); err != nil {
			return nil, nil, fmt.Errorf("enqueuer batch: begin: %w", err)
		}
		rows, err := tx.Query(ctx, takeSQL, takeArgs(from, s.cfg.BatchSize))
		if err != nil {
			return tx, nil, fmt.Errorf("enqueuer batch: take: %w", err)
		}
		staged, err = s.scanTaken(rows)
		return tx, staged, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("enqueuer batch: acquire: %w", err)
	}
	tx = &movingTx{conn: conn}
	b := &pgx.Batch{}
	for _, q := range moveBegin {
		b.Queue(q)
	}
	b.Queue(takeSQL, takeArgs(from, s.cfg.BatchSize))
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("enqueuer batch: take: %w", cerr)
		}
	}()
	for range moveBegin {
		if _, err := br.Exec(); err != nil {
			return tx, nil, fmt.Errorf("enqueuer batch: begin: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return tx, nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	staged, err = s.scanTaken(rows)
	return tx, staged, err
}

// scanTaken reads the take's rows and closes them.
func (s *Service) scanTaken(rows pgx.Rows) ([]stagedRow, error) {
	defer rows.Close()
	// Grown as rows come: a steady-state batch is a row or two, and a
	// slice of --batch-size rows (760 kB at the default) allocated and
	// zeroed per transaction was most of the process's CPU, in the
	// garbage collector.
	staged := make([]stagedRow, 0, min(s.cfg.BatchSize, 64))
	for rows.Next() {
		var r stagedRow
		if err := rows.Scan(&r.ID, &r.CreatedAt, &r.Kind, &r.Args, &r.Queue, &r.Priority, &r.MaxAttempts, &r.ScheduledAt, &r.Tags, &r.Metadata); err != nil {
			return nil, fmt.Errorf("enqueuer batch: scan: %w", err)
		}
		staged = append(staged, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueuer batch: take: %w", err)
	}
	return staged, nil
}

// movingTx is the move's transaction on a connection that beginTake began
// by hand: pgx.Tx's methods on the connection, with COMMIT and ROLLBACK
// sent as statements. Commit or Rollback releases the connection to the
// pool, which closes it instead if it is still in a transaction (a COMMIT
// or ROLLBACK that failed on the way). It has no nested transactions: the
// row-by-row redo, which needs savepoints, begins a pgx transaction.
type movingTx struct {
	conn *pgxpool.Conn
}

var errNoNestedMove = errors.New("enqueuer batch: a move has no nested transactions")

func (t *movingTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNoNestedMove }

// Commit commits, and reports pgx.ErrTxCommitRollback when the server
// rolled back instead (the transaction had failed), as pgx's own Tx does.
func (t *movingTx) Commit(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	defer t.release()
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *movingTx) Rollback(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	defer t.release()
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	return err
}

func (t *movingTx) release() {
	t.conn.Release()
	t.conn = nil
}

func (t *movingTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *movingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

func (t *movingTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *movingTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

func (t *movingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *movingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *movingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *movingTx) Conn() *pgx.Conn { return t.conn.Conn() }

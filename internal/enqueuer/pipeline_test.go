package enqueuer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// roundTrips records what a pool sends, one entry per round trip: a
// statement sent alone, or a pipeline (a pgx batch) of several.
type roundTrips struct {
	mu   sync.Mutex
	sent []string
}

func (r *roundTrips) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, s)
}

func (r *roundTrips) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sent
	r.sent = nil
	return s
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(strings.Join(strings.Fields(d.SQL), " "))
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var qs []string
	for _, q := range d.Batch.QueuedQueries {
		qs = append(qs, strings.Join(strings.Fields(q.SQL), " "))
	}
	r.add("pipeline: " + strings.Join(qs, " | "))
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	r.add("copy " + d.TableName.Sanitize())
	return ctx
}
func (r *roundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// A move begins, sets its session and takes its rows in one round trip,
// then inserts into River and commits: three in all, and a take that finds
// nothing two. Its rows reach River once (the SQL oracle), and the pool
// keeps no connection in a transaction after it.
func TestMoveBeginsInTheTakesRoundTrip(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newService(t, pool)

	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'send_ride_receipt', jsonb_build_object('n', g) FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	trips.take()
	res, err := s.moveBatch(ctx, fullPass, fullPass, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.moved != 3 {
		t.Fatalf("moved %d rows, want 3", res.moved)
	}
	// River's own statements may come between (its one-time version
	// check, the notification its insert sends its workers, at most one a
	// queue per interval): the move's own are the first and the last.
	sent := trips.take()
	for i, q := range sent {
		own := strings.HasPrefix(q, "BEGIN") || strings.Contains(q, "DELETE FROM staged_jobs") || q == "COMMIT"
		if want := i == 0 || i == len(sent)-1; own != want || (i == 0 && !strings.HasPrefix(q, "pipeline: BEGIN | ")) {
			t.Fatalf("a move's round trips, want the pipeline of BEGIN and the take first, COMMIT last and only River's between:\n%s", strings.Join(sent, "\n"))
		}
	}
	if !strings.Contains(sent[0], "DELETE FROM staged_jobs") || sent[len(sent)-1] != "COMMIT" {
		t.Fatalf("a move's round trips:\n%s", strings.Join(sent, "\n"))
	}
	if ids := stagedIDsInRiver(t, pool); len(ids) != 3 {
		t.Fatalf("River holds staged ids %v, want 3", ids)
	}

	trips.take()
	res, err = s.moveBatch(ctx, fullPass, fullPass, false)
	if err != nil || res.taken != 0 {
		t.Fatalf("empty take: %+v, %v", res, err)
	}
	if sent := trips.take(); len(sent) != 2 || sent[1] != "ROLLBACK" {
		t.Fatalf("an empty take sent %d round trips, want the pipeline and ROLLBACK:\n%s", len(sent), strings.Join(sent, "\n"))
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Fatalf("%d sessions left in a transaction", n)
	}
}

// A move whose transaction failed commits as a rollback, reported as pgx
// reports it, and the pool does not hand the connection out again in the
// failed transaction.
func TestFailedMoveCommitsAsRollback(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	s := newService(t, pool)
	tx, _, err := s.beginTake(ctx, fullPass, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("commit of a failed move: %v, want pgx.ErrTxCommitRollback", err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("rollback after commit: %v, want pgx.ErrTxClosed", err)
	}
	// A connection handed out in the failed transaction would fail
	// every statement (25P02).
	for range 2 * int(pool.Config().MaxConns) {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("the pool handed out a connection in the failed transaction: %v", err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Fatalf("%d sessions left in a transaction", n)
	}
}

package migrate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// retryLog records the migrator's retry warnings.
type retryLog struct {
	mu      sync.Mutex
	retries []string // each retry's "waited_in" and " on " its "table"
}

func (l *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *retryLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *retryLog) WithGroup(string) slog.Handler            { return l }
func (l *retryLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "retrying") {
		return nil
	}
	var where, table string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "waited_in":
			where = a.Value.String()
		case "table":
			table = a.Value.String()
		}
		return true
	})
	where += " on " + table
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retries = append(l.retries, where)
	return nil
}

func (l *retryLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.retries...)
}

// lockCase is a schema one migration short of a statement that needs a lock
// the API's writes hold, and the API's write to that table.
type lockCase struct {
	name     string
	upTo     int64  // idemd migrations applied before
	table    string // the table the next migration locks
	apiWrite string // an API statement on it, one row
	blocked  string // a word of the blocked statement, as the retry log names it
}

var lockCases = []lockCase{
	// 00018 drops and creates staged_jobs's trigger (ACCESS EXCLUSIVE).
	{name: "staged_jobs trigger", upTo: 17, table: "staged_jobs",
		apiWrite: `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{}')`, blocked: "00018"},
	// 00012 creates idempotency_keys's trigger (SHARE ROW EXCLUSIVE).
	{name: "idempotency_keys trigger", upTo: 11, table: "idempotency_keys",
		apiWrite: `INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id)
VALUES ('k-' || gen_random_uuid(), 'POST', '{}', '/rides', 'started', 1)`, blocked: "00012"},
	// 00002 builds indexes CONCURRENTLY: the build waits for the API's
	// open writes, times out with an INVALID index left behind, and is
	// retried.
	{name: "idempotency_keys index built concurrently", upTo: 1, table: "idempotency_keys",
		apiWrite: `INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id)
VALUES ('k-' || gen_random_uuid(), 'POST', '{}', '/rides', 'started', 1)`, blocked: "00002"},
}

// holdWriteLock opens a transaction that wrote one row of lc.table, as an
// API request in progress would, and returns it open.
func holdWriteLock(t *testing.T, pool *pgxpool.Pool, lc lockCase) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, lc.apiWrite); err != nil {
		t.Fatal(err)
	}
	return tx
}

// While a transaction holds a lock a migration's statement conflicts with,
// the migration waits at most --ddl-lock-timeout and retries, so an API
// write to the table issued meanwhile is not stuck behind its lock request
// and completes with the holder still open; once the holder ends, the
// migration completes.
func TestUpRetriesTableLockWithoutStallingAPI(t *testing.T) {
	for _, lc := range lockCases {
		t.Run(lc.name, func(t *testing.T) {
			pool := emptyDatabase(t)
			ctx := context.Background()
			migrateUpTo(t, pool, lc.upTo)
			holder := holdWriteLock(t, pool, lc)

			log := &retryLog{}
			type outcome struct {
				res *migrate.Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := migrate.Up(ctx, pool, migrate.Options{
					DDLLockTimeout: 100 * time.Millisecond, LockWait: 2 * time.Minute, Logger: slog.New(log),
				})
				done <- outcome{res, err}
			}()
			testwait.Until(t, time.Minute, "the migration to retry a lock wait", func() bool { return len(log.list()) >= 1 })

			// The API's write, issued once the migration's request for
			// the table's lock is queued again behind the holder.
			testwait.Until(t, time.Minute, "the migration to wait for "+lc.table+"'s lock", func() bool {
				var waiting bool
				err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND (l.relation = $1::regclass OR l.locktype IN ('virtualxid', 'transactionid'))
  AND a.query NOT LIKE '%pg_locks%')`, lc.table).Scan(&waiting)
				return err == nil && waiting
			})
			apiDone := make(chan error, 1)
			go func() {
				_, err := pool.Exec(ctx, lc.apiWrite)
				apiDone <- err
			}()
			var apiErr error
			testwait.Until(t, time.Minute, "the API's write to complete while the holder is open", func() bool {
				select {
				case apiErr = <-apiDone:
					return true
				default:
					return false
				}
			})
			if apiErr != nil {
				t.Fatalf("the API's write: %v", apiErr)
			}
			select {
			case o := <-done:
				t.Fatalf("the migration ended while the holder was open: %+v, %v", o.res, o.err)
			default:
			}

			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var o outcome
			testwait.Until(t, 2*time.Minute, "the migration to complete", func() bool {
				select {
				case o = <-done:
					return true
				default:
					return false
				}
			})
			if o.err != nil {
				t.Fatalf("migrate after the holder ended: %v", o.err)
			}
			retries := log.list()
			if o.res.LockRetries < 1 || len(retries) != o.res.LockRetries {
				t.Fatalf("LockRetries %d, retries logged %d", o.res.LockRetries, len(retries))
			}
			if !strings.Contains(retries[0], lc.blocked) || !strings.HasSuffix(retries[0], " on "+lc.table) {
				t.Fatalf("the retry log names %q, not migration %s on %s", retries[0], lc.blocked, lc.table)
			}
			if err := migrate.Check(ctx, pool); err != nil {
				t.Fatal(err)
			}
			// An independent look at the catalogue: every index valid,
			// the API's rows (holder's and the one issued meanwhile) there.
			var invalid []string
			rows, err := pool.Query(ctx, `SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT i.indisvalid AND n.nspname = 'public'`)
			if err == nil {
				invalid, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(invalid) > 0 {
				t.Fatalf("invalid indexes after the migration: %v", invalid)
			}
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{lc.table}.Sanitize()).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 2 {
				t.Fatalf("%s has %d rows, want the holder's and the API's", lc.table, n)
			}
			t.Logf("%d retries, first in %s", o.res.LockRetries, retries[0])
		})
	}
}

// A lock held past --lock-wait: migrate gives up with an error that says
// so, keeping what it applied before; the next run completes.
func TestUpGivesUpAfterLockWait(t *testing.T) {
	lc := lockCases[0]
	pool := emptyDatabase(t)
	ctx := context.Background()
	migrateUpTo(t, pool, lc.upTo)
	holder := holdWriteLock(t, pool, lc)

	_, err := migrate.Up(ctx, pool, migrate.Options{DDLLockTimeout: 50 * time.Millisecond, LockWait: 500 * time.Millisecond})
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || pg.Code != pgerrcode.LockNotAvailable || !strings.Contains(err.Error(), "--lock-wait") {
		t.Fatalf("want a lock_not_available error naming --lock-wait, got %v", err)
	}
	t.Log(err)
	// River's migrations, before idemd's, were kept.
	s, err := migrate.Inspect(ctx, pool, migrate.Newest())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.River) != 0 || s.Database != lc.upTo {
		t.Fatalf("after giving up: River missing %v, idemd at %d (want %d)", s.River, s.Database, lc.upTo)
	}

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := migrate.Up(ctx, pool, migrate.Options{DDLLockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.LockRetries != 0 {
		t.Fatalf("%d retries without a holder", res.LockRetries)
	}
	if err := migrate.Check(ctx, pool); err != nil {
		t.Fatal(err)
	}
}

// Behind a transaction-mode pooler migrate sets no session lock_timeout:
// the one the operator gives the migrator's role (here the database's, the
// test's own) applies, and a statement it times out is retried all the
// same until --lock-wait (long enough here for a first attempt on a loaded
// machine to leave time for a retry).
func TestUpTransactionPoolerUsesTheRolesLockTimeout(t *testing.T) {
	lc := lockCases[0]
	pool := emptyDatabase(t)
	ctx := context.Background()
	migrateUpTo(t, pool, lc.upTo)
	admin, err := pgx.Connect(ctx, dbtest.WithDatabase(dbtest.ServerURL(t), pool.Config().ConnConfig.Database))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{pool.Config().ConnConfig.Database}.Sanitize()+" SET lock_timeout = '50ms'"); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // new connections read the database's setting
	holder := holdWriteLock(t, pool, lc)

	log := &retryLog{}
	_, err = migrate.Up(ctx, pool, migrate.Options{TransactionPooler: true, DDLLockTimeout: time.Hour, LockWait: 5 * time.Second, Logger: slog.New(log)})
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || pg.Code != pgerrcode.LockNotAvailable || len(log.list()) == 0 {
		t.Fatalf("want lock_not_available after retries (%d logged), got %v", len(log.list()), err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{TransactionPooler: true}); err != nil {
		t.Fatal(err)
	}
}

package enqueuer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestPlans: the plans sql.go's comments promise. In a transaction begun
// as the enqueuer begins its own (beginSQL), every statement with @from
// walks staged_jobs_pkey from @from — an index scan whose condition is
// id >= @from, from a drain's floor, the sweep's low-water mark, or the
// start — and never reads the heap by a sequential or bitmap scan; the
// take deletes by the ctids its locking scan returned (a TID scan) and
// sorts nothing, whatever the table's statistics say; so does the
// server-side move, which takes as the take does and sorts only the rows
// it took.
func TestPlans(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var mid int64
	if err := pool.QueryRow(ctx, `WITH i AS (INSERT INTO staged_jobs (job_name, job_args)
SELECT 'send_ride_receipt', jsonb_build_object('ride_id', g) FROM generate_series(1, 20000) g RETURNING id)
SELECT min(id) + 10000 FROM i`).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	// As the table's owner, the migrator: statistics that say "20,000
	// rows, half of them at or above @from", which without beginSQL's
	// settings make a sequential scan and a sort look cheaper.
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `VACUUM ANALYZE staged_jobs`); err != nil {
		t.Fatal(err)
	}
	type planCase struct {
		name string
		sql  string
		args pgx.NamedArgs
		want []string
	}
	var cases []planCase
	for _, from := range []struct {
		name string
		id   int64
	}{{"from the floor", mid}, {"full pass", fullPass}} {
		cases = append(cases,
			planCase{"take " + from.name, takeSQL, takeArgs(from.id, DefaultSettings().BatchSize),
				[]string{"Index Scan using staged_jobs_pkey", "Index Cond: (id >= ", "LockRows", "Tid Scan on staged_jobs", "TID Cond: (ctid = ANY ("}},
			planCase{"move " + from.name, riverdb.MoveSQL, newService(t, pool).moveArgs(from.id, fullPass, riverNewest),
				[]string{"Index Scan using staged_jobs_pkey", "Index Cond: (id >= ", "LockRows", "Tid Scan on staged_jobs", "TID Cond: (ctid = ANY ("}},
			planCase{"backlog " + from.name, backlogSQL, pgx.NamedArgs{"from": from.id},
				[]string{"Index Scan using staged_jobs_pkey", "Index Cond: (id >= "}},
			planCase{"sweep " + from.name, sweepSQL, pgx.NamedArgs{"from": from.id},
				[]string{"Index Only Scan using staged_jobs_pkey", "id >= "}},
		)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // EXPLAIN only
	for _, c := range cases {
		rows, err := tx.Query(ctx, "EXPLAIN "+c.sql, c.args)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := strings.Join(lines, "\n")
		for _, want := range c.want {
			if !strings.Contains(plan, want) {
				t.Errorf("%s: plan without %q:\n%s", c.name, want, plan)
			}
		}
		for _, not := range []string{"Seq Scan", "Bitmap"} {
			if strings.Contains(plan, not) {
				t.Errorf("%s: plan with %q:\n%s", c.name, not, plan)
			}
		}
		// The sorts allowed are the move's of the rows it took: by unique
		// key (one job per key) and by unique key then id, in which they
		// go into River.
		for _, l := range lines {
			if k := strings.TrimSpace(l); strings.Contains(l, "Sort Key:") &&
				k != "Sort Key: taken.id" && k != "Sort Key: taken.unique_key, taken.id" && k != "Sort Key: firsts.unique_key, firsts.id" {
				t.Errorf("%s: plan with a sort:\n%s", c.name, plan)
			}
		}
	}
}

// TestBacklog: Backlog counts every staged row and finds the oldest by
// created_at (not the lowest id: a transaction that began earlier may
// take its id later), its age by the database clock; the gauges read the
// same from the low-water mark.
func TestBacklog(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	b, err := Backlog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if b.Jobs != 0 || b.Oldest != nil || b.OldestAge != 0 {
		t.Fatalf("empty table: %+v", b)
	}
	var low, high int64
	if err := pool.QueryRow(ctx, `WITH i AS (INSERT INTO staged_jobs (job_name, job_args, created_at)
VALUES ('k', '{}', now() - interval '10 seconds'), ('k', '{}', now() - interval '90 seconds'), ('k', '{}', now()) RETURNING id)
SELECT min(id), max(id) FROM i`).Scan(&low, &high); err != nil {
		t.Fatal(err)
	}
	b, err = Backlog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if b.Jobs != 3 || b.Oldest == nil || b.OldestAge < 90*time.Second || b.OldestAge > 10*time.Minute {
		t.Fatalf("3 staged rows, the oldest 90s old: %+v", b)
	}
	var oldest time.Time
	if err := pool.QueryRow(ctx, `SELECT created_at FROM staged_jobs WHERE id = $1 + 1`, low).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if !b.Oldest.Equal(oldest) {
		t.Fatalf("oldest %s, want the second row's %s", b.Oldest, oldest)
	}
	// From a mark: the rows below it are not counted.
	b, err = backlog(ctx, pool, high)
	if err != nil {
		t.Fatal(err)
	}
	if b.Jobs != 1 || b.OldestAge > time.Minute {
		t.Fatalf("from id %d: %+v", high, b)
	}
}

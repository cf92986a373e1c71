package reaper

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/runhistory"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/pgbouncertest"
)

// TestProcessThroughTransactionPooler runs reaper processes through a real
// PgBouncer in transaction mode, with other clients sharing its pool: runs
// back to back each delete (never lock_held: no other run exists; every
// other one with --concurrency 3), a run
// SIGKILLed mid-batch is followed by one that takes its lease over and
// finishes, and afterwards no server connection of the pool holds an
// advisory lock, a LISTEN, a prepared statement or a changed setting (the
// session-lock reaper left its lock, wal_compression and
// client_connection_check_interval there).
func TestProcessThroughTransactionPooler(t *testing.T) {
	testProcessThroughPooler(t, "transaction")
}

// TestProcessThroughSessionPooler: the same through PgBouncer in session
// mode, which keeps a server connection per client and resets it with
// DISCARD ALL when the client leaves.
func TestProcessThroughSessionPooler(t *testing.T) {
	testProcessThroughPooler(t, "session")
}

func testProcessThroughPooler(t *testing.T, mode string) {
	bin, dbURL, pool := newProcessTest(t)
	ctx := context.Background()
	db := pgbouncertest.DatabaseName(t, dbURL)
	b := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 4, Mode: mode, Users: []string{dbtest.RuntimeRole}})
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitLoad, loadTx := b.Load(loadCtx, db, "postgres", 2)
	// The reaper as the runtime role of deploy/sql/roles.sql, as deployed
	// (and so the test's runtime pool sees its waits in pg_stat_activity).
	pooled := b.URL(db, dbtest.RuntimeRole)
	args := func(extra ...string) []string {
		return append([]string{"--pooler", mode, "--batch-size", "10", "--lease-ttl", "6s", "--statement-timeout", "5s"}, extra...)
	}

	for run := range 4 {
		insertOldKeys(t, pool, 25)
		// Every other run takes its batches three at a time: one round of
		// 10, 10 and 5 keys, each batch its own pooled transaction.
		var extra []string
		if run%2 == 1 {
			extra = []string{"--concurrency", "3"}
		}
		p := runReaper(t, bin, pooled, 0, args(extra...)...)
		if !strings.Contains(p.stderr.String(), `"result":"complete"`) || !strings.Contains(p.stderr.String(), `"deleted":25`) {
			t.Fatalf("run %d did not delete its 25 keys:\n%s", run, p.stderr)
		}
		if extra != nil && !strings.Contains(p.stderr.String(), `"concurrent_batches":3`) {
			t.Fatalf("run %d did not take its three batches in one round:\n%s", run, p.stderr)
		}
	}

	killInSecondBatch(t, bin, pooled, pool, args()...)
	next := runReaper(t, bin, pooled, 0, args()...)
	if !strings.Contains(next.stderr.String(), "took over the lease") || !strings.Contains(next.stderr.String(), `"result":"complete"`) {
		t.Fatalf("the run after the killed one did not take over and finish:\n%s", next.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys left", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 10+4*8 {
		t.Fatalf("%d reviews, want one per deleted unfinished key (%d)", n, 10+4*8)
	}
	if leaseHeld(t, pool) {
		t.Fatal("the last run did not release its lease")
	}
	// The run history through the pooler: the four runs, the killed one
	// interrupted with its first batch, the one after it.
	runs, err := runhistory.LastRuns(ctx, pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s/%d", r.Result, r.Deleted))
	}
	if want := "complete/20 interrupted/10 complete/25 complete/25 complete/25 complete/25"; strings.Join(got, " ") != want {
		t.Fatalf("run history (newest first) %v, want %s", got, want)
	}

	stopLoad()
	if err := waitLoad(); err != nil {
		t.Fatal(err)
	}
	if loadTx.Load() == 0 {
		t.Fatal("no other client used the pool")
	}
	noAdvisoryLocks(t, pool)
	leaks, err := b.Leaks(ctx, db, dbtest.RuntimeRole, "application_name")
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) > 0 {
		t.Fatalf("server connections were left with session state: %q", leaks)
	}
}

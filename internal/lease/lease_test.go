package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestAcquireRenewRelease(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()

	a, err := lease.Acquire(ctx, pool, "task", "a", time.Hour)
	if err != nil || !a.Acquired || a.PrevHolder != "" {
		t.Fatalf("first acquire: %+v, %v", a, err)
	}
	b, err := lease.Acquire(ctx, pool, "task", "b", time.Hour)
	if err != nil || b.Acquired || b.PrevHolder != "a" {
		t.Fatalf("acquire of a held lease: %+v, %v", b, err)
	}
	if err := lease.Renew(ctx, pool, "task", "a", time.Hour); err != nil {
		t.Fatalf("holder's renew: %v", err)
	}
	if err := lease.Renew(ctx, pool, "task", "b", time.Hour); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("renew by a non-holder: %v, want ErrLost", err)
	}
	if ok, err := lease.Release(ctx, pool, "task", "b"); err != nil || ok {
		t.Fatalf("release by a non-holder: %v, %v", ok, err)
	}
	if ok, err := lease.Release(ctx, pool, "task", "a"); err != nil || !ok {
		t.Fatalf("holder's release: %v, %v", ok, err)
	}
	if b, err := lease.Acquire(ctx, pool, "task", "b", time.Hour); err != nil || !b.Acquired || b.TookOver("b") {
		t.Fatalf("acquire after release: %+v, %v", b, err)
	}
}

// expire ends every lease by the database clock, rather than waiting for
// it.
func expire(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "UPDATE idemd_leases SET expires_at = clock_timestamp() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
}

// TestExpiredLeaseIsTakenOver: a holder that stops renewing loses its lease
// to the next taker, and its own later renewal fails.
func TestExpiredLeaseIsTakenOver(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if a, err := lease.Acquire(ctx, pool, "task", "dead", time.Hour); err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	expire(t, pool)
	a, err := lease.Acquire(ctx, pool, "task", "next", time.Hour)
	if err != nil || !a.Acquired || !a.TookOver("next") || a.PrevHolder != "dead" {
		t.Fatalf("takeover: %+v, %v", a, err)
	}
	if err := lease.Renew(ctx, pool, "task", "dead", time.Hour); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the old holder's renew: %v, want ErrLost", err)
	}
}

// TestRenewFencesTheTransaction: while a transaction that renewed the lease
// is open, a taker is told the holder is busy even after the expiry, and
// after it commits the renewed expiry stands.
func TestRenewFencesTheTransaction(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if a, err := lease.Acquire(ctx, pool, "task", "a", time.Hour); err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	expire(t, pool)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := lease.Renew(ctx, tx, "task", "a", time.Hour); err != nil {
		t.Fatal(err)
	}
	b, err := lease.Acquire(ctx, pool, "task", "b", time.Hour)
	if err != nil || !b.Busy || b.Acquired {
		t.Fatalf("acquire during the guarded transaction: %+v, %v", b, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b, err = lease.Acquire(ctx, pool, "task", "b", time.Hour)
	if err != nil || b.Acquired || b.PrevHolder != "a" {
		t.Fatalf("acquire after the renewal committed: %+v, %v", b, err)
	}
}

// TestConcurrentAcquireOneWinner: of many takers racing for a free or an
// expired lease, exactly one gets it.
func TestConcurrentAcquireOneWinner(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	for round := range 10 {
		expire(t, pool)
		var mu sync.Mutex
		winners := 0
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				a, err := lease.Acquire(ctx, pool, "task", string(rune('a'+i))+string(rune('0'+round)), time.Hour)
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if a.Acquired {
					mu.Lock()
					winners++
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		if winners != 1 {
			t.Fatalf("round %d: %d takers got the lease", round, winners)
		}
	}
}

// TestFenceLetsTheHolderOverlap: two transactions fenced by the same
// holder run at once; while either is open a taker is told the holder is
// busy, even after the expiry, and a renewal waits for both to end. A
// fence by a holder who lost the lease fails.
func TestFenceLetsTheHolderOverlap(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if a, err := lease.Acquire(ctx, pool, "task", "a", time.Hour); err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	expire(t, pool)
	var txs []pgx.Tx
	for range 2 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		// A lock_timeout makes a fence that waited for the other fail here
		// instead of hanging the test.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			t.Fatal(err)
		}
		if err := lease.Fence(ctx, tx, "task", "a"); err != nil {
			t.Fatalf("fence %d: %v", len(txs)+1, err)
		}
		txs = append(txs, tx)
	}
	b, err := lease.Acquire(ctx, pool, "task", "b", time.Hour)
	if err != nil || !b.Busy || b.Acquired {
		t.Fatalf("acquire during the fenced transactions: %+v, %v", b, err)
	}

	renewed := make(chan error, 1)
	go func() { renewed <- lease.Renew(ctx, pool, "task", "a", time.Hour) }()
	// The renewal must be waiting on the row lock the fences hold.
	testwait.Until(t, 10*time.Second, "the renewal waits for the fences", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE idemd_leases%')`).Scan(&waiting)
		return err == nil && waiting
	})
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-renewed; err != nil {
		t.Fatalf("renew after the fences: %v", err)
	}
	if b, err := lease.Acquire(ctx, pool, "task", "b", time.Hour); err != nil || b.Acquired || b.PrevHolder != "a" {
		t.Fatalf("acquire after the renewal: %+v, %v", b, err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := lease.Fence(ctx, tx, "task", "b"); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("fence by a non-holder: %v, want ErrLost", err)
	}
}

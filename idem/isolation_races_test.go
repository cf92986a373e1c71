package idem_test

// Races on one key under every isolation the store offers (and the
// article's protocol, the anchor): whatever the level, one key is held by
// one request at a time and its phases never overlap. And what READ
// COMMITTED leaves to the API: rows of its own shared between keys.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

var allIsolations = []idem.Isolation{idem.ReadCommitted, idem.Serializable, idem.ArticleSerializable}

// beginAll starts n Begins of one request at once and returns how many got
// the key and the other errors.
func beginAll(t *testing.T, s *idem.Store, r idem.Request, n int) (won int, keys []*idem.Key) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			k, err := s.Begin(context.Background(), r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
				keys = append(keys, k)
			case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrConflict):
			default:
				t.Errorf("unexpected %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	return won, keys
}

// TestSameKeyRacesOneHolder: twenty requests with one new key, and twenty
// with one existing unlocked key (a request that failed and unlocked it),
// each time exactly one holds the key, and the claim continues from the
// recovery point the key is at.
func TestSameKeyRacesOneHolder(t *testing.T) {
	t.Parallel()
	for _, iso := range allIsolations {
		t.Run(iso.String(), func(t *testing.T) {
			s, pool := newStore(t, idem.Options{Isolation: iso})
			ctx := context.Background()
			won, keys := beginAll(t, s, req("key-new-race"), 20)
			if won != 1 {
				t.Fatalf("new key: %d requests got it", won)
			}
			k := keys[0]
			err := s.Phase(ctx, k, func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
				return idem.RecoveryPoint("middle"), nil
			})
			if err != nil {
				t.Fatal(err)
			}
			s.Unlock(ctx, k)
			won, keys = beginAll(t, s, req("key-new-race"), 20)
			if won != 1 {
				t.Fatalf("unlocked key: %d requests got it", won)
			}
			if keys[0].RecoveryPoint != "middle" || keys[0].ID != k.ID {
				t.Fatalf("claimed %+v", keys[0])
			}
			if r := readKey(t, pool, k.ID); !r.Locked || r.RecoveryPoint != "middle" {
				t.Fatalf("row %+v", r)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d keys (%v)", n, err)
			}
		})
	}
}

// TestTakeoverWaitsForRunningPhase: a request whose lock went stale is
// still inside a phase when another takes the key over. The takeover waits
// for that phase (the phase holds the key row), then continues from the
// recovery point the phase committed, and the old holder's next phase stops
// with ErrLockLost. Under the article's protocol there is no key row lock:
// SSI aborts one of the two instead (TestLockTimeoutTakeover covers it).
func TestTakeoverWaitsForRunningPhase(t *testing.T) {
	t.Parallel()
	for _, iso := range []idem.Isolation{idem.ReadCommitted, idem.Serializable} {
		t.Run(iso.String(), func(t *testing.T) {
			s, pool := newStore(t, idem.Options{Isolation: iso})
			ctx := context.Background()
			k, err := s.Begin(ctx, req("key-takeover"))
			if err != nil {
				t.Fatal(err)
			}
			// The holder's lock goes stale (the holder stalled for 91 s).
			var stale time.Time
			if err := pool.QueryRow(ctx, `UPDATE idempotency_keys SET locked_at = locked_at - interval '91 seconds'
				WHERE id = $1 RETURNING locked_at`, k.ID).Scan(&stale); err != nil {
				t.Fatal(err)
			}
			k.LockedAt = &stale
			inPhase, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			phaseErr := make(chan error, 1)
			go func() {
				phaseErr <- s.Phase(ctx, k, func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
					once.Do(func() { close(inPhase) })
					<-release
					return idem.RecoveryPoint("middle"), nil
				})
			}()
			<-inPhase
			type begun struct {
				k   *idem.Key
				err error
			}
			took := make(chan begun, 1)
			go func() {
				k2, err := s.Begin(ctx, req("key-takeover"))
				took <- begun{k2, err}
			}()
			waitForLockWait(t, pool)
			select {
			case b := <-took:
				t.Fatalf("the takeover did not wait for the running phase: %+v, %v", b.k, b.err)
			default:
			}
			close(release)
			if err := <-phaseErr; err != nil {
				t.Fatalf("old holder's phase: %v", err)
			}
			b := <-took
			if b.err != nil {
				t.Fatalf("takeover: %v", b.err)
			}
			if b.k.RecoveryPoint != "middle" {
				t.Fatalf("takeover continues from %q, want the committed middle", b.k.RecoveryPoint)
			}
			err = s.Phase(ctx, k, func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
				t.Error("the old holder's phase ran")
				return idem.Response(201, nil), nil
			})
			if !errors.Is(err, idem.ErrLockLost) {
				t.Fatalf("old holder: want ErrLockLost, got %v", err)
			}
			if r := readKey(t, pool, k.ID); !r.Locked || r.RecoveryPoint != "middle" {
				t.Fatalf("new holder's key disturbed: %+v", r)
			}
		})
	}
}

// waitForLockWait polls until a session of this database waits for a
// lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waited for a lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPhaseOnDeletedKeyLosesLock: a key deleted under a request (by hand:
// the reaper never deletes a locked key) stops its next phase before the
// phase runs.
func TestPhaseOnDeletedKeyLosesLock(t *testing.T) {
	t.Parallel()
	for _, iso := range allIsolations {
		t.Run(iso.String(), func(t *testing.T) {
			s, pool := newStore(t, idem.Options{Isolation: iso})
			ctx := context.Background()
			k, err := s.Begin(ctx, req("key-deleted"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE id = $1`, k.ID); err != nil {
				t.Fatal(err)
			}
			ran := false
			err = s.Phase(ctx, k, func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
				ran = true
				return idem.RecoveryPoint("middle"), nil
			})
			if !errors.Is(err, idem.ErrLockLost) {
				t.Fatalf("want ErrLockLost, got %v", err)
			}
			if ran && iso != idem.ArticleSerializable {
				t.Error("the phase ran on a deleted key")
			}
		})
	}
}

// TestReadCommittedPhasesMustLockTheirRows is what docs/api-authors.md
// asks of phases under READ COMMITTED: two requests with different keys
// add to one shared counter (a row of the API's own). Read, then written
// from what was read, without a lock: one addition is lost. With SELECT ...
// FOR UPDATE the second waits for the first and both count. SERIALIZABLE
// phases get the same result without the lock, by retrying one.
func TestReadCommittedPhasesMustLockTheirRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		iso  idem.Isolation
		lock bool
		want int
	}{
		{"read committed, no lock: lost update", idem.ReadCommitted, false, 1},
		{"read committed, FOR UPDATE", idem.ReadCommitted, true, 2},
		{"serializable, no lock", idem.Serializable, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pool := newStore(t, idem.Options{Isolation: tc.iso})
			ctx := context.Background()
			if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `CREATE TABLE balances (name TEXT PRIMARY KEY, n INT NOT NULL);
				INSERT INTO balances VALUES ('shared', 0)`); err != nil {
				t.Fatal(err)
			}
			read := `SELECT n FROM balances WHERE name = 'shared'`
			if tc.lock {
				read += ` FOR UPDATE`
			}
			aRead, bRead := make(chan struct{}), make(chan struct{})
			var onceA, onceB sync.Once
			phase := func(first bool) idem.Phases {
				return idem.Phases{"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
					if !first {
						<-aRead // B reads once A has read
					}
					var n int
					if err := tx.QueryRow(ctx, read).Scan(&n); err != nil {
						return nil, err
					}
					switch {
					case first && tc.lock:
						// A holds the row: B's read waits for A's commit.
						onceA.Do(func() { close(aRead); waitForLockWait(t, pool) })
					case first:
						// Both read before either writes.
						onceA.Do(func() { close(aRead); <-bRead })
					default:
						onceB.Do(func() { close(bRead) })
					}
					if _, err := tx.Exec(ctx, `UPDATE balances SET n = $1 WHERE name = 'shared'`, n+1); err != nil {
						return nil, err
					}
					return idem.Response(201, nil), nil
				}}
			}
			errs := make(chan error, 2)
			go func() { _, err := s.Execute(ctx, req("key-balance-a"), phase(true)); errs <- err }()
			go func() { _, err := s.Execute(ctx, req("key-balance-b"), phase(false)); errs <- err }()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT n FROM balances`).Scan(&n); err != nil || n != tc.want {
				t.Fatalf("balance %d (%v), want %d", n, err, tc.want)
			}
		})
	}
}

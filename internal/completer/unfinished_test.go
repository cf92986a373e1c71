package completer

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func tracked(t *testing.T, svc *Service, where string) int {
	t.Helper()
	var n int
	if err := svc.pool.QueryRow(context.Background(), `
SELECT count(*) FROM idemd_unfinished_keys u LEFT JOIN idempotency_keys k ON k.id = u.key_id WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every key inserted unfinished is tracked by the trigger (a finished one
// is not); the completer stops tracking the keys it sees finished, gives up
// on, or finds deleted, and keeps tracking those it will retry.
func TestUnfinishedKeysTracking(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "fin", 3, "started")
	insertKeys(t, pool, "retry", 2, "ride_created")
	insertKeys(t, pool, "giveup", 2, "started")
	insertKeys(t, pool, "gone", 1, "started")
	insertKeys(t, pool, "done", 4, "finished")
	api := newTestAPI(t, pool, func(key string, n int) action {
		switch key[:3] {
		case "ret":
			return actFail503
		case "giv":
			return actBadRequest
		case "gon":
			if _, err := pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE idempotency_key = $1`, key); err != nil {
				t.Error(err)
			}
			return actBadRequest
		}
		return actFinish
	})
	cfg := testConfig(api.srv.URL)
	cfg.MaxAttempts = 1
	svc := newTestService(t, pool, cfg)
	if n := tracked(t, svc, "true"); n != 8 {
		t.Fatalf("tracked %d keys, want the 8 inserted unfinished", n)
	}
	// The retried keys give up at once with MaxAttempts 1, except that
	// they must stay tracked while they back off: use a second service.
	cfg2 := cfg
	cfg2.MaxAttempts = 100
	svcRetry := newTestService(t, pool, cfg2)
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_leased_until = now() + interval '1 hour' WHERE idempotency_key NOT LIKE 'retry-%'`); err != nil {
		t.Fatal(err)
	}
	res, err := svcRetry.RunOnce(ctx)
	if err != nil || res.Retried != 2 {
		t.Fatalf("%+v %v", res, err)
	}
	if n := tracked(t, svc, "k.idempotency_key LIKE 'retry-%'"); n != 2 {
		t.Fatalf("keys backing off: %d tracked, want 2", n)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_leased_until = NULL, completer_next_attempt_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_next_attempt_at = NULL WHERE idempotency_key NOT LIKE 'retry-%'`); err != nil {
		t.Fatal(err)
	}
	res, err = svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Finished != 3 || res.GaveUp != 2 || res.Gone != 1 {
		t.Fatalf("%+v", res)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT COALESCE(k.idempotency_key, 'deleted') FROM idemd_unfinished_keys u LEFT JOIN idempotency_keys k ON k.id = u.key_id ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		left = append(left, k)
	}
	if len(left) != 2 || left[0] != "retry-1" || left[1] != "retry-2" {
		t.Fatalf("still tracked: %v, want only the keys backing off", left)
	}
}

// Keys the API finished itself, keys deleted (reaped) and keys given up
// are pruned; unfinished ones stay and remain candidates.
func TestPrune(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "p", 2*pruneBatch+10, "started")
	if _, err := pool.Exec(ctx, `
UPDATE idempotency_keys SET recovery_point = 'finished' WHERE split_part(idempotency_key, '-', 2)::int % 3 = 0;
UPDATE idempotency_keys SET completer_gave_up_at = now() WHERE split_part(idempotency_key, '-', 2)::int % 3 = 1 AND split_part(idempotency_key, '-', 2)::int % 2 = 0;
DELETE FROM idempotency_keys WHERE split_part(idempotency_key, '-', 2)::int % 7 = 0`); err != nil {
		t.Fatal(err)
	}
	api := newTestAPI(t, pool, always(actFinish))
	svc := newTestService(t, pool, testConfig(api.srv.URL))
	want := countWhere(t, pool, "recovery_point <> 'finished' AND completer_gave_up_at IS NULL")
	deleted, err := svc.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := tracked(t, svc, "true"); got != want || deleted != 2*pruneBatch+10-want {
		t.Fatalf("after prune: %d tracked (want %d), %d deleted", got, want, deleted)
	}
	if got := tracked(t, svc, "k.recovery_point <> 'finished' AND k.completer_gave_up_at IS NULL"); got != want {
		t.Fatalf("unfinished keys tracked: %d, want %d", got, want)
	}
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Finished != want {
		t.Fatalf("%+v %v", res, err)
	}
	if n := tracked(t, svc, "true"); n != 0 {
		t.Fatalf("%d keys still tracked after every key finished", n)
	}
}

// The trigger records a key the API's role inserts, although that role has
// no privilege on idemd_unfinished_keys (the trigger runs as its owner).
func TestTrackedUnderAPIRole(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, pool.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// What deploy/sql/roles.sql grants the API's role, and nothing more.
	if _, err := tx.Exec(ctx, `GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO `+dbtest.APIRole+`;
GRANT USAGE, SELECT ON SEQUENCE idempotency_keys_id_seq TO `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params, recovery_point)
VALUES ('api-role-1', 1, 'POST', '/rides', '{}', 'started')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT s; SELECT count(*) FROM idemd_unfinished_keys`); err == nil {
		t.Fatal("the API's role can read idemd_unfinished_keys; the test no longer shows the trigger needs no privilege")
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s; RESET ROLE`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM idemd_unfinished_keys u JOIN idempotency_keys k ON k.id = u.key_id AND k.created_at = u.created_at
WHERE k.idempotency_key = 'api-role-1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("tracked %d, %v", n, err)
	}
}

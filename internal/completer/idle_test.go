package completer

import (
	"context"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// The API sets last_run_at on the completer's replays as on any request.
// A replay that met a conflict (409 on a key no request holds) is retried
// after its backoff, not --idle after the replay: --idle is for a
// client's runs. A client's run after the completer's attempt still holds
// the key back for --idle.
func TestConflictedReplayIsNotHeldForIdle(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	api := newTestAPI(t, pool, func(_ string, n int) action {
		if n == 1 {
			return actMismatch // the test API sets last_run_at = now() first
		}
		return actFinish
	})
	cfg := testConfig(api.srv.URL)
	cfg.Idle = time.Minute // the default: far longer than the test
	svc := newTestService(t, pool, cfg)
	keys := insertKeys(t, pool, "conflicted", 2, "started")

	if _, err := svc.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := api.requests(); n != 2 {
		t.Fatalf("first pass: %d replays, want 2", n)
	}
	for _, k := range keys {
		if r := getKey(t, pool, k); r.RecoveryPoint == "finished" || r.Attempts != 1 {
			t.Fatalf("%s after its conflict: %+v, want unfinished with 1 attempt", k, r)
		}
	}
	// keys[1]: a client takes it again after the completer's attempt.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET last_run_at = now() WHERE idempotency_key = $1`, keys[1]); err != nil {
		t.Fatal(err)
	}

	if _, err := svc.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if r := getKey(t, pool, keys[0]); r.RecoveryPoint != "finished" {
		t.Fatalf("%s: %+v, want finished by the retry of the second pass", keys[0], r)
	}
	if n := api.requests(); n != 3 {
		t.Fatalf("second pass: %d replays in all, want 3 (the client's key left alone)", n)
	}
	if r := getKey(t, pool, keys[1]); r.RecoveryPoint == "finished" || r.Attempts != 1 {
		t.Fatalf("%s, run by a client since: %+v, want left alone for --idle", keys[1], r)
	}
}

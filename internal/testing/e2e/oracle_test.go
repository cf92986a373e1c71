//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/e2e/oracle"
)

// unworkedQueue is the River queue of the jobs the suite stages itself (the
// silent faults' load, silent_test.go): no worker takes it, so its jobs
// stay available, and the oracle checks that each committed row arrived
// exactly once, not that it was worked.
const unworkedQueue = "e2e_unworked"

// oracle checks the end state against the database and the fake Stripe's
// own records (internal/testing/e2e/oracle), then what this suite's own
// scenario adds: the seeded old keys, the rides' keys, the replay front's
// overlaps and the clients' 201s.
func (e *env) oracle(ctx context.Context, stats simulator.Stats) {
	t := e.t
	charges, err := e.rr.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := oracle.Check(ctx, e.pool, charges, oracle.Options{Poison: e.poison, Grace: grace, UnworkedQueue: unworkedQueue})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range res.Notes {
		e.logf("oracle: %s", n)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	// Nothing younger than the retention window deleted; old keys gone,
	// the unfinished ones with a review.
	for _, c := range []struct{ what, sql string }{
		{"old keys the reaper left behind", `SELECT id FROM idempotency_keys WHERE idempotency_key LIKE 'e2e-old-%'`},
		{"old unfinished keys deleted without a review",
			`SELECT g FROM generate_series(41, 60) g WHERE NOT EXISTS
			 (SELECT 1 FROM idempotency_key_reviews r WHERE r.idempotency_key = 'e2e-old-' || g)`},
		{"rides whose (young) key was deleted", `SELECT id FROM rides WHERE idempotency_key_id IS NULL`},
	} {
		v, err := oracle.None(ctx, e.pool, c.what, c.sql)
		if err != nil {
			t.Fatal(err)
		}
		if v != "" {
			t.Error(v)
		}
	}
	if o := e.front.overlapping(); len(o) > 0 {
		t.Errorf("two replays of one key were in flight at once (invariant 2): %v", o)
	}
	// Every 201 a client saw is a finished key with its ride (the completers
	// finish more: the keys of clients that gave up).
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND response_code = 201`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < int(stats.Created) {
		t.Errorf("%d keys finished with 201, but clients saw %d rides created", n, stats.Created)
	}
}

func execOut(ctx context.Context, bin string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", bin, err)
	}
	return string(out), nil
}

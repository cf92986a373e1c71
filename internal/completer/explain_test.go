package completer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// The plan candidateSQL's comment promises, for it and the statements
// built on it: a walk of idemd_unfinished_keys' primary key bounded by the
// grace period (an index-only scan, or a bitmap scan of the same index)
// and one primary-key probe of idempotency_keys per candidate, never a scan
// of idempotency_keys, so the cost follows the backlog and not the table.
func TestCandidatePlan(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	// A table as the API leaves it between two prunes: keys created over
	// the retention window, one in a thousand abandoned unfinished (the
	// backlog), and the keys of the last seconds, tracked when the API
	// inserted them and finished since (Prune has not removed them yet).
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, recovery_point, user_id)
SELECT t, 'plan-' || g, t, NULL, 'POST', '{}', '/charges',
       CASE WHEN g % 1000 = 0 THEN 'started' ELSE 'finished' END, 1 + g % 100
FROM generate_series(1, 50000) g,
     LATERAL (SELECT now() - interval '72 hours' * random() - interval '10 minutes' AS t) x;
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, recovery_point, user_id)
SELECT now() - interval '10 seconds' * random(), 'recent-' || g, now(), now(), 'POST', '{}', '/charges', 'started', 1 + g % 100
FROM generate_series(1, 2000) g;
UPDATE idempotency_keys SET recovery_point = 'finished', locked_at = NULL WHERE idempotency_key LIKE 'recent-%'`); err != nil {
		t.Fatal(err)
	}
	owner := dbtest.MigratorPool(t, pool)
	for _, table := range []string{"idempotency_keys", "idemd_unfinished_keys"} {
		if _, err := owner.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	// The default --grace, --idle, --lock-timeout.
	cfg := Config{Settings: DefaultSettings()}
	cfg.APIURL = "http://127.0.0.1:1"
	svc := newTestService(t, pool, cfg)
	// claimOneSQL takes the probe's id and tracked created_at.
	one := svc.candidateArgs(1)
	var keyID int64
	var trackedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT key_id, created_at FROM idemd_unfinished_keys ORDER BY 2 LIMIT 1`).Scan(&keyID, &trackedAt); err != nil {
		t.Fatal(err)
	}
	one["key_id"], one["tracked_at"] = keyID, trackedAt
	for name, c := range map[string]struct {
		sql  string
		args pgx.NamedArgs
	}{
		"candidates":       {candidateSQL, svc.candidateArgs(100)},
		"claim":            {claimSQL, svc.candidateArgs(100)},
		"probe candidates": {probeCandidatesSQL, svc.candidateArgs(100)},
		"probe claim":      {claimOneSQL, one},
	} {
		sql, args := c.sql, c.args
		rows, err := pool.Query(ctx, "EXPLAIN "+sql, args)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		for _, want := range []string{"idemd_unfinished_keys_pkey", "Index Scan using idempotency_keys_pkey"} {
			if !strings.Contains(plan, want) {
				t.Errorf("%s: plan without %q:\n%s", name, want, plan)
			}
		}
		for _, not := range []string{"Seq Scan", "idempotency_keys_created_at"} {
			if strings.Contains(plan, not) {
				t.Errorf("%s: plan with %q:\n%s", name, not, plan)
			}
		}
	}
}

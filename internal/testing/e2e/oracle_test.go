//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/examples/rocketrides/simulator"
)

// unworkedQueue is the River queue of the jobs the suite stages itself (the
// silent faults' load, silent_test.go): no worker takes it, so its jobs
// stay available, and the oracle checks that each committed row arrived
// exactly once, not that it was worked.
const unworkedQueue = "e2e_unworked"

// oracle checks the end state against the database and the fake Stripe's
// own records (what reached "Stripe", not what the API believes).
func (e *env) oracle(ctx context.Context, stats simulator.Stats) {
	t := e.t
	rows := func(sql string, args ...any) []string {
		t.Helper()
		rs, err := e.pool.Query(ctx, sql, args...)
		if err != nil {
			t.Fatalf("oracle query: %v\n%s", err, sql)
		}
		out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (string, error) {
			vals, err := r.Values()
			return fmt.Sprint(vals...), err
		})
		if err != nil {
			t.Fatalf("oracle query: %v\n%s", err, sql)
		}
		return out
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("oracle query: %v\n%s", err, sql)
		}
		return n
	}
	expectNone := func(what, sql string, args ...any) {
		t.Helper()
		if bad := rows(sql, args...); len(bad) > 0 {
			if len(bad) > 10 {
				bad = append(bad[:10], fmt.Sprintf("... %d in all", len(bad)))
			}
			t.Errorf("%s: %v", what, bad)
		}
	}

	// 1. Every committed staged row became exactly one River job (or, for
	// the poison rows, a dead letter with a reason) and was worked.
	staged := count(`SELECT count(*) FROM e2e_staged_log`)
	e.logf("oracle: %d staged rows committed, %d of them poison", staged, len(e.poison))
	if staged <= len(e.poison) {
		t.Errorf("no ride staged a receipt job")
	}
	expectNone("rows left in staged_jobs", `SELECT id FROM staged_jobs`)
	expectNone("committed staged rows without exactly one River job",
		`SELECT l.id, ' jobs=', count(j.id) FROM e2e_staged_log l
		 LEFT JOIN river_job j ON (j.metadata->>'idemd_staged_id')::bigint = l.id
		 WHERE l.id <> ALL($1) GROUP BY l.id HAVING count(j.id) <> 1`, e.poison)
	expectNone("River jobs that no committed staged row asked for",
		`SELECT j.id, ' ', j.kind FROM river_job j WHERE NOT EXISTS
		 (SELECT 1 FROM e2e_staged_log l WHERE l.id = (j.metadata->>'idemd_staged_id')::bigint AND l.id <> ALL($1))`, e.poison)
	expectNone("River jobs not worked", `SELECT id, ' ', state FROM river_job WHERE state <> 'completed' AND queue <> $1`, unworkedQueue)
	expectNone("worked River jobs without their one receipt",
		`SELECT j.id FROM river_job j WHERE j.queue <> $1 AND (SELECT count(*) FROM ride_receipts r WHERE r.river_job_id = j.id) <> 1`, unworkedQueue)
	expectNone("River jobs of the unworked queue that something took",
		`SELECT id, ' ', state FROM river_job WHERE queue = $1 AND state <> 'available'`, unworkedQueue)
	expectNone("poison rows not dead-lettered with a reason",
		`SELECT p FROM unnest($1::bigint[]) p WHERE NOT EXISTS
		 (SELECT 1 FROM staged_jobs_dead d WHERE d.id = p AND btrim(d.reason) <> '')`, e.poison)
	for _, r := range rows(`SELECT id, ': ', reason FROM staged_jobs_dead ORDER BY id`) {
		e.logf("oracle: dead letter %s", r)
	}
	expectNone("dead letters that were not poison",
		`SELECT id, ' ', reason FROM staged_jobs_dead WHERE id <> ALL($1)`, e.poison)

	// 2. Every key is finished, flagged with a reason, or younger than the
	// completers' grace; nothing flagged without a reason; nothing younger
	// than the retention window deleted; old keys gone, the unfinished
	// ones with a review.
	expectNone("keys neither finished, flagged nor young",
		`SELECT k.id, ' ', k.recovery_point, ' attempts=', k.completer_attempts, ' ', coalesce(k.completer_last_error, '') FROM idempotency_keys k
		 WHERE k.recovery_point <> 'finished' AND k.created_at < now() - make_interval(secs => $1)
		   AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id)`, grace.Seconds())
	expectNone("reviews without a reason",
		`SELECT id FROM idempotency_key_reviews WHERE reason IS NULL OR btrim(reason) = '' OR snapshot IS NULL`)
	expectNone("old keys the reaper left behind", `SELECT id FROM idempotency_keys WHERE idempotency_key LIKE 'e2e-old-%'`)
	expectNone("old unfinished keys deleted without a review",
		`SELECT g FROM generate_series(41, 60) g WHERE NOT EXISTS
		 (SELECT 1 FROM idempotency_key_reviews r WHERE r.idempotency_key = 'e2e-old-' || g)`)
	expectNone("rides whose (young) key was deleted", `SELECT id FROM rides WHERE idempotency_key_id IS NULL`)
	expectNone("keys with more than one ride", `SELECT idempotency_key_id, ' rides=', count(*) FROM rides
		WHERE idempotency_key_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1`)
	for _, r := range rows(`SELECT reason, ' by ', flagged_by, ': ', count(*) FROM idempotency_key_reviews GROUP BY reason, flagged_by ORDER BY 1, 3`) {
		e.logf("oracle: reviews %s", r)
	}
	for _, r := range rows(`SELECT recovery_point, ' ', coalesce(response_code, 0), ': ', count(*) FROM idempotency_keys GROUP BY 1, 3 ORDER BY 1, 3`) {
		e.logf("oracle: keys %s", r)
	}

	// Finished rides: a 201 has its charge and its one receipt; a 402 has
	// neither.
	expectNone("rides answered 201 without a charge id or with other than one receipt",
		`SELECT r.id FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
		 WHERE k.recovery_point = 'finished' AND k.response_code = 201
		   AND (r.stripe_charge_id IS NULL OR (SELECT count(*) FROM ride_receipts x WHERE x.ride_id = r.id) <> 1)`)
	expectNone("declined rides with a charge id or a receipt",
		`SELECT r.id FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
		 WHERE k.recovery_point = 'finished' AND k.response_code = 402
		   AND (r.stripe_charge_id IS NOT NULL OR EXISTS (SELECT 1 FROM ride_receipts x WHERE x.ride_id = r.id))`)
	expectNone("rides with more than one receipt", `SELECT ride_id FROM ride_receipts GROUP BY ride_id HAVING count(*) > 1`)

	// 3. The fake Stripe's records: no ride charged twice, no charge
	// without a ride (of the right customer), and every recorded charge id
	// is a charge Stripe made.
	charges, err := e.rr.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type ride struct {
		customer string
		chargeID *string
		finished bool
	}
	rides := map[int64]ride{}
	rs, err := e.pool.Query(ctx, `SELECT r.id, u.stripe_customer_id, r.stripe_charge_id, coalesce(k.recovery_point = 'finished', false)
		FROM rides r JOIN users u ON u.id = r.user_id LEFT JOIN idempotency_keys k ON k.id = r.idempotency_key_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id int64
		var rd ride
		if err := rs.Scan(&id, &rd.customer, &rd.chargeID, &rd.finished); err != nil {
			t.Fatal(err)
		}
		rides[id] = rd
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	perRide := map[int64]int{}
	perKey := map[string]int{}
	byID := map[string]bool{}
	succeeded, failed, unrecordedFlagged := 0, 0, 0
	for _, c := range charges {
		byID[c.ID] = true
		perKey[c.IdempotencyKey]++
		if c.Status == "succeeded" {
			succeeded++
		} else {
			failed++
		}
		idStr, ok := strings.CutPrefix(c.Description, "Charge for ride ")
		id, err := strconv.ParseInt(idStr, 10, 64)
		if !ok || err != nil {
			t.Errorf("charge %s: description %q names no ride", c.ID, c.Description)
			continue
		}
		perRide[id]++
		rd, exists := rides[id]
		switch {
		case !exists:
			t.Errorf("charge %s for ride %d, which does not exist", c.ID, id)
		case rd.customer != c.Customer:
			t.Errorf("charge %s for ride %d billed %s, the ride's rider is %s", c.ID, id, c.Customer, rd.customer)
		case c.Status == "succeeded" && rd.finished && (rd.chargeID == nil || *rd.chargeID != c.ID):
			t.Errorf("charge %s for finished ride %d, which records charge %v", c.ID, id, rd.chargeID)
		case c.Status == "succeeded" && !rd.finished && rd.chargeID == nil:
			unrecordedFlagged++ // a flagged key: the review shows the charge to a human
		}
	}
	for id, n := range perRide {
		if n > 1 {
			t.Errorf("ride %d charged %d times", id, n)
		}
	}
	for k, n := range perKey {
		if n > 1 {
			t.Errorf("Stripe idempotency key %q created %d charges", k, n)
		}
	}
	for id, rd := range rides {
		if rd.chargeID != nil && !byID[*rd.chargeID] {
			t.Errorf("ride %d records charge %s, which Stripe never made", id, *rd.chargeID)
		}
	}
	e.logf("oracle: %d rides, %d charges (%d succeeded, %d declined), %d charged rides of flagged keys without a recorded charge id",
		len(rides), len(charges), succeeded, failed, unrecordedFlagged)
	if o := e.front.overlapping(); len(o) > 0 {
		t.Errorf("two replays of one key were in flight at once (invariant 2): %v", o)
	}
	// Every 201 a client saw is a finished key with its ride (the completers
	// finish more: the keys of clients that gave up).
	if n := count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND response_code = 201`); n < int(stats.Created) {
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

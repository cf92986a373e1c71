// Package oracle checks the end state of a Rocket Rides run with idemd
// against SQL and the fake Stripe's own records (what reached "Stripe", not
// what the API believes): every committed staged job became exactly one
// River job and was worked, no key is left unfinished that nobody gave up,
// and no ride was charged twice. The end-to-end fault suite
// (internal/testing/e2e) and the soak (internal/testing/e2e/soak) both end
// with it; each adds the checks of its own scenario.
package oracle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
)

// InstallStagedLog records every staged row that commits (a row staged by
// a transaction that rolls back disappears from the log with it): the
// oracle's list of what the enqueuers had to move. pool must be allowed to
// create a table and a trigger on staged_jobs (the API's or the admin's
// role).
func InstallStagedLog(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
CREATE TABLE e2e_staged_log (id BIGINT PRIMARY KEY, job_name TEXT NOT NULL, job_args JSONB NOT NULL);
CREATE FUNCTION e2e_staged_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO e2e_staged_log (id, job_name, job_args) VALUES (NEW.id, NEW.job_name, NEW.job_args);
    RETURN NULL;
END;
$$;
CREATE TRIGGER e2e_staged_log AFTER INSERT ON staged_jobs FOR EACH ROW EXECUTE FUNCTION e2e_staged_log();`)
	if err != nil {
		return fmt.Errorf("staged log: %w", err)
	}
	return nil
}

// Options describe the run the oracle judges.
type Options struct {
	// Poison are staged rows the run made unmovable on purpose: each must be
	// a dead letter with a reason, and nothing else may be.
	Poison []int64
	// Grace: a key younger than this (the completers' --grace) may still be
	// unfinished without anybody having given it up.
	Grace time.Duration
	// UnworkedQueue, when set, is a River queue no worker takes (a run's
	// own load, staged without a receipt to send): its jobs must each
	// match one committed staged row like any other and stay available;
	// the checks of worked jobs leave it out.
	UnworkedQueue string
}

// Result is what the oracle found: Violations are failed checks (empty when
// the run passed), Notes what it counted, for the log.
type Result struct {
	Violations []string
	Notes      []string
	// Staged is the number of staged rows that committed; Charges the fake
	// Stripe's charges; Rides the rides in the database.
	Staged, Charges, Rides int
}

// Passed reports whether no check failed.
func (r *Result) Passed() bool { return len(r.Violations) == 0 }

func (r *Result) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Check runs every check against pool (a role that reads the API's and
// idemd's tables) and charges (the fake Stripe's /_fake/charges). The
// staged-job checks need InstallStagedLog before the traffic. An error is a
// check that could not run.
func Check(ctx context.Context, pool *pgxpool.Pool, charges []fakestripe.Charge, o Options) (*Result, error) {
	r := &Result{}
	for _, check := range []func(context.Context, *pgxpool.Pool, Options, *Result) error{jobs, keys, rides} {
		if err := check(ctx, pool, o, r); err != nil {
			return r, err
		}
	}
	if err := chargesCheck(ctx, pool, charges, r); err != nil {
		return r, err
	}
	return r, nil
}

// None runs sql and returns a violation naming what when it returns any
// row (up to ten of them shown), or "" when it returns none.
func None(ctx context.Context, pool *pgxpool.Pool, what, sql string, args ...any) (string, error) {
	bad, err := Rows(ctx, pool, sql, args...)
	if err != nil {
		return "", err
	}
	if len(bad) == 0 {
		return "", nil
	}
	if len(bad) > 10 {
		bad = append(bad[:10], fmt.Sprintf("... %d in all", len(bad)))
	}
	return fmt.Sprintf("%s: %v", what, bad), nil
}

// Rows runs sql and returns each row's values printed side by side.
func Rows(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]string, error) {
	rs, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("oracle query: %w\n%s", err, sql)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (string, error) {
		vals, err := r.Values()
		return fmt.Sprint(vals...), err
	})
	if err != nil {
		return nil, fmt.Errorf("oracle query: %w\n%s", err, sql)
	}
	return out, nil
}

// expectNone adds the violation of None to r.
func expectNone(ctx context.Context, pool *pgxpool.Pool, r *Result, what, sql string, args ...any) error {
	v, err := None(ctx, pool, what, sql, args...)
	if err != nil {
		return err
	}
	if v != "" {
		r.Violations = append(r.Violations, v)
	}
	return nil
}

// jobs: every committed staged row became exactly one River job (or, for
// the poison rows, a dead letter with a reason) and was worked.
func jobs(ctx context.Context, pool *pgxpool.Pool, o Options, r *Result) error {
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM e2e_staged_log`).Scan(&r.Staged); err != nil {
		return fmt.Errorf("oracle: staged log: %w", err)
	}
	r.note("%d staged rows committed, %d of them poison", r.Staged, len(o.Poison))
	if r.Staged <= len(o.Poison) {
		r.violate("no ride staged a receipt job")
	}
	poison := o.Poison
	if poison == nil {
		poison = []int64{}
	}
	// River queue names are never empty: "" leaves out no queue.
	unworked := o.UnworkedQueue
	checks := []struct {
		what, sql string
		args      []any
	}{
		{"rows left in staged_jobs", `SELECT id FROM staged_jobs`, nil},
		{"committed staged rows without exactly one River job",
			`SELECT l.id, ' jobs=', count(j.id) FROM e2e_staged_log l
			 LEFT JOIN river_job j ON (j.metadata->>'idemd_staged_id')::bigint = l.id
			 WHERE l.id <> ALL($1) GROUP BY l.id HAVING count(j.id) <> 1`, []any{poison}},
		{"River jobs that no committed staged row asked for",
			`SELECT j.id, ' ', j.kind FROM river_job j WHERE NOT EXISTS
			 (SELECT 1 FROM e2e_staged_log l WHERE l.id = (j.metadata->>'idemd_staged_id')::bigint AND l.id <> ALL($1))`, []any{poison}},
		{"River jobs not worked", `SELECT id, ' ', state FROM river_job WHERE state <> 'completed' AND queue <> $1`, []any{unworked}},
		{"worked River jobs without their one receipt",
			`SELECT j.id FROM river_job j WHERE j.queue <> $1 AND (SELECT count(*) FROM ride_receipts r WHERE r.river_job_id = j.id) <> 1`, []any{unworked}},
		{"River jobs of the unworked queue that something took",
			`SELECT id, ' ', state FROM river_job WHERE queue = $1 AND state <> 'available'`, []any{unworked}},
		{"poison rows not dead-lettered with a reason",
			`SELECT p FROM unnest($1::bigint[]) p WHERE NOT EXISTS
			 (SELECT 1 FROM staged_jobs_dead d WHERE d.id = p AND btrim(d.reason) <> '')`, []any{poison}},
		{"dead letters that were not poison", `SELECT id, ' ', reason FROM staged_jobs_dead WHERE id <> ALL($1)`, []any{poison}},
	}
	for _, c := range checks {
		if err := expectNone(ctx, pool, r, c.what, c.sql, c.args...); err != nil {
			return err
		}
	}
	dead, err := Rows(ctx, pool, `SELECT id, ': ', reason FROM staged_jobs_dead ORDER BY id`)
	if err != nil {
		return err
	}
	for _, d := range dead {
		r.note("dead letter %s", d)
	}
	return nil
}

// keys: every key is finished, flagged with a reason, or younger than the
// completers' grace.
func keys(ctx context.Context, pool *pgxpool.Pool, o Options, r *Result) error {
	if err := expectNone(ctx, pool, r, "keys neither finished, flagged nor young",
		`SELECT k.id, ' ', k.recovery_point, ' attempts=', k.completer_attempts, ' ', coalesce(k.completer_last_error, '') FROM idempotency_keys k
		 WHERE k.recovery_point <> 'finished' AND k.created_at < now() - make_interval(secs => $1)
		   AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id)`, o.Grace.Seconds()); err != nil {
		return err
	}
	if err := expectNone(ctx, pool, r, "reviews without a reason",
		`SELECT id FROM idempotency_key_reviews WHERE reason IS NULL OR btrim(reason) = '' OR snapshot IS NULL`); err != nil {
		return err
	}
	for _, q := range []struct{ what, sql string }{
		{"reviews", `SELECT reason, ' by ', flagged_by, ': ', count(*) FROM idempotency_key_reviews GROUP BY reason, flagged_by ORDER BY 1, 3`},
		{"keys", `SELECT recovery_point, ' ', coalesce(response_code, 0), ': ', count(*) FROM idempotency_keys GROUP BY 1, 3 ORDER BY 1, 3`},
	} {
		rows, err := Rows(ctx, pool, q.sql)
		if err != nil {
			return err
		}
		for _, row := range rows {
			r.note("%s %s", q.what, row)
		}
	}
	return nil
}

// rides: a finished 201 has its charge and its one receipt; a 402 has
// neither.
func rides(ctx context.Context, pool *pgxpool.Pool, _ Options, r *Result) error {
	for _, c := range []struct{ what, sql string }{
		{"rides answered 201 without a charge id or with other than one receipt",
			`SELECT r.id FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
			 WHERE k.recovery_point = 'finished' AND k.response_code = 201
			   AND (r.stripe_charge_id IS NULL OR (SELECT count(*) FROM ride_receipts x WHERE x.ride_id = r.id) <> 1)`},
		{"declined rides with a charge id or a receipt",
			`SELECT r.id FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
			 WHERE k.recovery_point = 'finished' AND k.response_code = 402
			   AND (r.stripe_charge_id IS NOT NULL OR EXISTS (SELECT 1 FROM ride_receipts x WHERE x.ride_id = r.id))`},
		{"rides with more than one receipt", `SELECT ride_id FROM ride_receipts GROUP BY ride_id HAVING count(*) > 1`},
		{"keys with more than one ride", `SELECT idempotency_key_id, ' rides=', count(*) FROM rides
			WHERE idempotency_key_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1`},
	} {
		if err := expectNone(ctx, pool, r, c.what, c.sql); err != nil {
			return err
		}
	}
	return nil
}

// chargesCheck compares the fake Stripe's records with the rides: no ride
// charged twice, no charge without a ride (of the right customer), and
// every recorded charge id is a charge Stripe made.
func chargesCheck(ctx context.Context, pool *pgxpool.Pool, charges []fakestripe.Charge, r *Result) error {
	type ride struct {
		customer string
		chargeID *string
		finished bool
	}
	all := map[int64]ride{}
	rs, err := pool.Query(ctx, `SELECT r.id, u.stripe_customer_id, r.stripe_charge_id, coalesce(k.recovery_point = 'finished', false)
		FROM rides r JOIN users u ON u.id = r.user_id LEFT JOIN idempotency_keys k ON k.id = r.idempotency_key_id`)
	if err != nil {
		return fmt.Errorf("oracle: rides: %w", err)
	}
	for rs.Next() {
		var id int64
		var rd ride
		if err := rs.Scan(&id, &rd.customer, &rd.chargeID, &rd.finished); err != nil {
			rs.Close()
			return fmt.Errorf("oracle: rides: %w", err)
		}
		all[id] = rd
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("oracle: rides: %w", err)
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
			r.violate("charge %s: description %q names no ride", c.ID, c.Description)
			continue
		}
		perRide[id]++
		rd, exists := all[id]
		switch {
		case !exists:
			r.violate("charge %s for ride %d, which does not exist", c.ID, id)
		case rd.customer != c.Customer:
			r.violate("charge %s for ride %d billed %s, the ride's rider is %s", c.ID, id, c.Customer, rd.customer)
		case c.Status == "succeeded" && rd.finished && (rd.chargeID == nil || *rd.chargeID != c.ID):
			r.violate("charge %s for finished ride %d, which records charge %v", c.ID, id, rd.chargeID)
		case c.Status == "succeeded" && !rd.finished && rd.chargeID == nil:
			unrecordedFlagged++ // a flagged key: the review shows the charge to a human
		}
	}
	twice := 0
	for id, n := range perRide {
		if n > 1 {
			twice++
			r.violate("ride %d charged %d times", id, n)
		}
	}
	for k, n := range perKey {
		if n > 1 {
			r.violate("Stripe idempotency key %q created %d charges", k, n)
		}
	}
	for id, rd := range all {
		if rd.chargeID != nil && !byID[*rd.chargeID] {
			r.violate("ride %d records charge %s, which Stripe never made", id, *rd.chargeID)
		}
	}
	r.Charges, r.Rides = len(charges), len(all)
	r.note("%d rides, %d charges (%d succeeded, %d declined), %d rides charged more than once, %d charged rides of flagged keys without a recorded charge id",
		len(all), len(charges), succeeded, failed, twice, unrecordedFlagged)
	return nil
}

package ctl_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/operator"
	"github.com/idemd/idemd/internal/review"
)

// giveUp puts key in the state the completer leaves a key it gave up on
// (internal/completer, giveUp): given up, attempts recorded, untracked,
// flagged for review.
func giveUp(t *testing.T, pool *pgxpool.Pool, key int64, attempts int) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
UPDATE idempotency_keys SET completer_gave_up_at = now(), completer_attempts = $2,
       completer_last_error = 'API answered 500 Internal Server Error', completer_next_attempt_at = now() + interval '1 hour'
WHERE id = $1`, key, attempts); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM idemd_unfinished_keys WHERE key_id = $1", key); err != nil {
		t.Fatal(err)
	}
	return flag(t, pool, key, review.ReasonCompleterGaveUp, "1 hour")
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestKeysShow(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	db := []string{"--database-url", url}
	id := addKey(t, pool, "k-show", "ride_created", "2 hours")
	rev := giveUp(t, pool, id, 20)
	sid := strconv.FormatInt(id, 10)
	link := `{"idemd_key_id": ` + sid + `}`
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, metadata) VALUES ('send_receipt', '{}', $1)`, link); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs_dead (id, created_at, job_name, job_args, metadata, reason)
VALUES (990001, now(), 'bad_kind', '{}', $1, 'unknown_kind: bad_kind')`, link); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, state, scheduled_at)
VALUES ('{}', 'send_receipt', 25, $1, 1, 'default', 'available', now())`, `{"idemd_key_id": `+sid+`, "idemd_staged_id": 990002}`); err != nil {
		t.Fatal(err)
	}
	// A job of another key is not listed.
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, metadata) VALUES ('other', '{}', '{"idemd_key_id": 987654321}')`); err != nil {
		t.Fatal(err)
	}

	code, out, errs := run(t, append(db, "keys", "show", "--user-id", "9", "--key", "k-show")...)
	if code != 0 {
		t.Fatalf("show: exit %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{"k-show", "gave_up", "ride_created", "POST /rides", "API answered 500", "completer_gave_up",
		"send_receipt", "bad_kind", "staged id 990002", "tracked", "no (the completer does not look at it)",
		"retry: idemctl keys retry --id " + sid} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "other") {
		t.Errorf("another key's job is listed:\n%s", out)
	}

	var rep operator.KeyReport
	code, out, _ = run(t, append(db, "keys", "show", "--id", sid, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil {
		t.Fatalf("show json: exit %d, %v\n%s", code, err, out)
	}
	if rep.Key == nil || rep.Key.ID != id || rep.State != operator.StateGaveUp || rep.Key.CompleterAttempts != 20 ||
		len(rep.Reviews) != 1 || rep.Reviews[0].ID != rev || !rep.Retryable || rep.Tracked ||
		len(rep.Jobs.Staged) != 1 || len(rep.Jobs.Dead) != 1 || len(rep.Jobs.River) != 1 {
		t.Fatalf("json report: %+v", rep)
	}

	// A reaped key is shown from its review's snapshot.
	if _, err := pool.Exec(ctx, "DELETE FROM idempotency_keys WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, append(db, "keys", "show", "--user-id", "9", "--key", "k-show")...)
	if code != 0 || !strings.Contains(out, "gone") || !strings.Contains(out, "retry: not possible") {
		t.Fatalf("gone key: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := run(t, append(db, "keys", "show", "--id", "99999999")...); code != 3 || !strings.Contains(errs, "not found") {
		t.Fatalf("unknown key: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "keys", "show", "--user-id", "9")...); code != 2 || !strings.Contains(errs, "--key is required") {
		t.Fatalf("--user-id without --key: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "keys", "show", "--id", "3", "--key", "x", "-o", "yaml")...); code != 2 || !strings.Contains(errs, "-o") && !strings.Contains(errs, "output") {
		t.Fatalf("bad flags: exit %d, %s", code, errs)
	}
}

func TestKeysRetry(t *testing.T) {
	url, pool := setup(t)
	db := []string{"--database-url", url}
	id := addKey(t, pool, "k-retry", "ride_created", "2 hours")
	rev := giveUp(t, pool, id, 20)
	sid := strconv.FormatInt(id, 10)

	// No identity: refused before anything is touched, whatever $USER is.
	t.Setenv("USER", "root")
	t.Setenv("IDEMD_OPERATOR", "")
	code, _, errs := run(t, append(db, "keys", "retry", "--id", sid, "--note", "fixed")...)
	if code != 2 || !strings.Contains(errs, "--by") {
		t.Fatalf("retry without --by: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "keys", "retry", "--id", sid, "--by", "alice")...); code != 2 || !strings.Contains(errs, "--note is required") {
		t.Fatalf("retry without --note: exit %d, %s", code, errs)
	}
	if n := count(t, pool, "SELECT count(*) FROM idempotency_keys WHERE id = $1 AND completer_gave_up_at IS NOT NULL", id); n != 1 {
		t.Fatalf("refused retry changed the key")
	}

	t.Setenv("IDEMD_OPERATOR", "alice")
	code, out, errs := run(t, append(db, "keys", "retry", "--id", sid, "--note", "API bug 123 fixed in v2.3")...)
	if code != 0 || !strings.Contains(out, "handed back to the completer by alice") {
		t.Fatalf("retry: exit %d\n%s%s", code, out, errs)
	}
	// The completer's decision columns are reset, the key is tracked again,
	// the last error is kept, the review is resolved and the action recorded.
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE id = $1 AND completer_gave_up_at IS NULL
AND completer_attempts = 0 AND completer_next_attempt_at IS NULL AND completer_leased_until IS NULL
AND completer_last_error LIKE 'API answered 500%'`, id); n != 1 {
		t.Fatal("key not reset")
	}
	if n := count(t, pool, "SELECT count(*) FROM idemd_unfinished_keys u JOIN idempotency_keys k ON k.id = u.key_id AND k.created_at = u.created_at WHERE k.id = $1", id); n != 1 {
		t.Fatal("key not tracked again")
	}
	if n := count(t, pool, "SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_by = 'alice' AND resolution_note LIKE '%API bug 123%'", rev); n != 1 {
		t.Fatal("review not resolved")
	}
	if n := count(t, pool, `SELECT count(*) FROM idemd_operator_actions WHERE actor = 'alice' AND action = 'key_retry'
AND via = 'idemctl' AND key_id = $1 AND review_id = $2 AND note = 'API bug 123 fixed in v2.3'
AND (detail->>'completer_attempts')::int = 20 AND detail->>'completer_gave_up_at' IS NOT NULL`, id, rev); n != 1 {
		t.Fatal("action not recorded")
	}
	// The candidate query of the completer (its conditions, internal/completer
	// candidateConditions, with no grace) finds the key after the retry.
	if n := count(t, pool, `SELECT count(*) FROM idemd_unfinished_keys u JOIN idempotency_keys c ON c.id = u.key_id
WHERE c.id = $1 AND c.recovery_point <> 'finished' AND c.completer_gave_up_at IS NULL
  AND (c.completer_next_attempt_at IS NULL OR c.completer_next_attempt_at <= now())
  AND (c.completer_leased_until IS NULL OR c.completer_leased_until < now())`, id); n != 1 {
		t.Fatal("the completer would not take the key")
	}

	// Nothing to reset now: refused, nothing recorded.
	code, _, errs = run(t, append(db, "keys", "retry", "--id", sid, "--note", "again")...)
	if code != 3 || !strings.Contains(errs, "nothing to reset") {
		t.Fatalf("second retry: exit %d, %s", code, errs)
	}
	// A key the completer leases right now is refused.
	if _, err := pool.Exec(context.Background(), "UPDATE idempotency_keys SET completer_attempts = 3, completer_leased_until = now() + interval '2 minutes' WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run(t, append(db, "keys", "retry", "--id", sid, "--note", "x")...); code != 3 || !strings.Contains(errs, "replaying the key right now") {
		t.Fatalf("leased: exit %d, %s", code, errs)
	}
	// A finished key, and one past the give-up horizon, are refused.
	fin := addKey(t, pool, "k-finished", "finished", "1 hour")
	giveUp(t, pool, fin, 5)
	if code, _, errs := run(t, append(db, "keys", "retry", "--user-id", "9", "--key", "k-finished", "--note", "x")...); code != 3 || !strings.Contains(errs, "finished") {
		t.Fatalf("finished: exit %d, %s", code, errs)
	}
	old := addKey(t, pool, "k-old", "started", "30 hours")
	giveUp(t, pool, old, 1)
	if code, _, errs := run(t, append(db, "keys", "retry", "--user-id", "9", "--key", "k-old", "--note", "x")...); code != 3 || !strings.Contains(errs, "--give-up-after") {
		t.Fatalf("past horizon: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "keys", "retry", "--id", "99999999", "--note", "x")...); code != 3 || !strings.Contains(errs, "not found") {
		t.Fatalf("unknown: exit %d, %s", code, errs)
	}
	if n := count(t, pool, "SELECT count(*) FROM idemd_operator_actions"); n != 1 {
		t.Fatalf("refused retries recorded actions: %d", n)
	}
}

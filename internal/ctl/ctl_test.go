package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := ctl.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// statusJSON runs `idemctl status -o json` on url with args and decodes
// it; a failure fails the test.
func statusJSON(t *testing.T, url string, args ...string) ctl.Status {
	t.Helper()
	code, out, errs := run(t, append([]string{"--database-url", url, "status", "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var st ctl.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return st
}

func setup(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, pool
}

// addKey inserts a key created age ago at recovery point rp.
func addKey(t *testing.T, pool *pgxpool.Pool, name, rp, age string) int64 {
	t.Helper()
	var id int64
	err := pool.QueryRow(context.Background(), `
INSERT INTO idempotency_keys (created_at, idempotency_key, request_method, request_params, request_path, recovery_point, user_id, locked_at)
VALUES (now() - $3::interval, $1, 'POST', '{}', '/rides', $2, 9, NULL) RETURNING id`, name, rp, age).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// flag flags key and backdates the review by age.
func flag(t *testing.T, pool *pgxpool.Pool, key int64, reason, age string) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := review.Flag(ctx, pool, key, reason, "test", "tester"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `UPDATE idempotency_key_reviews SET flagged_at = now() - $2::interval
WHERE key_id = $1 AND reason = $3 RETURNING id`, key, age, reason).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestReviewListAndResolve(t *testing.T) {
	url, pool := setup(t)
	old := flag(t, pool, addKey(t, pool, "k-old", "started", "80 hours"), review.ReasonUnfinishedAtRetention, "2 days")
	gaveUp := flag(t, pool, addKey(t, pool, "k-gave-up", "ride_created", "10 hours"), review.ReasonCompleterGaveUp, "1 hour")
	db := []string{"--database-url", url}

	code, out, errs := run(t, append(db, "review", "list")...)
	if code != 0 || !strings.Contains(out, "k-old") || !strings.Contains(out, "k-gave-up") || !strings.Contains(out, "RECOVERY_POINT") {
		t.Fatalf("list: exit %d\n%s%s", code, out, errs)
	}
	if strings.Index(out, "k-old") > strings.Index(out, "k-gave-up") {
		t.Errorf("list is not oldest first:\n%s", out)
	}

	var got []ctl.Review
	code, out, _ = run(t, append(db, "review", "list", "--reason", review.ReasonCompleterGaveUp, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("list json: exit %d, %v\n%s", code, err, out)
	}
	if len(got) != 1 || got[0].ID != gaveUp || got[0].RecoveryPoint == nil || *got[0].RecoveryPoint != "ride_created" || len(got[0].Snapshot) == 0 {
		t.Fatalf("reason filter: %+v", got)
	}
	_, out, _ = run(t, append(db, "review", "list", "--older-than", "24h", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].ID != old {
		t.Fatalf("--older-than: %s", out)
	}
	_, out, _ = run(t, append(db, "review", "list", "--newer-than", "2h", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].ID != gaveUp {
		t.Fatalf("--newer-than: %s", out)
	}

	id := strconv.FormatInt(old, 10)
	if code, out, errs := run(t, append(db, "review", "resolve", id, "--note", "refunded by hand", "--by", "alice")...); code != 0 || !strings.Contains(out, "resolved by alice") {
		t.Fatalf("resolve: exit %d\n%s%s", code, out, errs)
	}
	var by, note string
	var resolvedAtSet bool
	if err := pool.QueryRow(context.Background(), "SELECT resolved_by, resolution_note, resolved_at IS NOT NULL FROM idempotency_key_reviews WHERE id = $1", old).Scan(&by, &note, &resolvedAtSet); err != nil {
		t.Fatal(err)
	}
	if by != "alice" || note != "refunded by hand" || !resolvedAtSet {
		t.Fatalf("resolved row: %s %q %v", by, note, resolvedAtSet)
	}
	// Resolving twice never overwrites the first note.
	if code, _, errs := run(t, append(db, "review", "resolve", id, "--note", "again", "--by", "bob")...); code != 3 || !strings.Contains(errs, "already resolved by alice") {
		t.Fatalf("second resolve: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "review", "resolve", "999999", "--note", "x", "--by", "alice")...); code != 3 || !strings.Contains(errs, "no review 999999") {
		t.Fatalf("resolve unknown: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, append(db, "review", "resolve", id, "--by", "alice")...); code != 2 || !strings.Contains(errs, "--note is required") {
		t.Fatalf("resolve without note: exit %d, %s", code, errs)
	}

	// No identity: refused (exit 2) before anything is touched, whatever
	// $USER is; the OS user is never recorded as who resolved a review.
	gid := strconv.FormatInt(gaveUp, 10)
	t.Setenv("USER", "root")
	t.Setenv("IDEMD_OPERATOR", "")
	for _, by := range [][]string{nil, {"--by", "  "}} {
		code, _, errs := run(t, append(append(db, "review", "resolve", gid, "--note", "retried by hand"), by...)...)
		if code != 2 || !strings.Contains(errs, "--by (or IDEMD_OPERATOR) is required") {
			t.Fatalf("resolve with --by %q: exit %d, %s", by, code, errs)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_at IS NULL", gaveUp); n != 1 {
		t.Fatal("a refused resolve changed the review")
	}
	// IDEMD_OPERATOR is the configured identity, as for keys retry.
	t.Setenv("IDEMD_OPERATOR", "carol")
	if code, out, errs := run(t, append(db, "review", "resolve", gid, "--note", "retried by hand")...); code != 0 || !strings.Contains(out, "resolved by carol") {
		t.Fatalf("resolve as IDEMD_OPERATOR: exit %d\n%s%s", code, out, errs)
	}
	if n := count(t, pool, "SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_by = 'carol'", gaveUp); n != 1 {
		t.Fatal("IDEMD_OPERATOR not recorded as resolved_by")
	}

	// Open list no longer shows it; resolved list shows who and the note.
	_, out, _ = run(t, append(db, "review", "list")...)
	if strings.Contains(out, "k-old") {
		t.Fatalf("resolved review still listed as open:\n%s", out)
	}
	_, out, _ = run(t, append(db, "review", "list", "--state", "resolved", "--reason", review.ReasonUnfinishedAtRetention)...)
	if !strings.Contains(out, "alice") || !strings.Contains(out, "refunded by hand") || strings.Contains(out, "k-gave-up") {
		t.Fatalf("resolved list:\n%s", out)
	}
}

func TestReviewListBadFlagsExit2(t *testing.T) {
	code, _, errs := run(t, "--database-url", "postgres://x/y", "review", "list", "--limit", "0", "--older-than", "2h", "--newer-than", "1h", "-o", "yaml")
	if code != 2 {
		t.Fatalf("exit %d, want 2: %s", code, errs)
	}
	if !strings.Contains(errs, "--output") {
		t.Fatalf("stderr: %s", errs)
	}
	code, _, errs = run(t, "--database-url", "postgres://x/y", "review", "list", "--limit", "0", "--older-than", "2h", "--newer-than", "1h")
	if code != 2 || !strings.Contains(errs, "--limit") || !strings.Contains(errs, "--newer-than") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

func TestStatus(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	addKey(t, pool, "started-1", "started", "1 hour")
	addKey(t, pool, "started-2", "started", "2 hours")
	addKey(t, pool, "ride", "ride_created", "3 hours")
	addKey(t, pool, "done", "finished", "1 hour")
	addKey(t, pool, "old-1", "finished", "73 hours")
	k := addKey(t, pool, "old-2", "started", "100 hours")
	flag(t, pool, k, review.ReasonUnfinishedAtRetention, "5 minutes")
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, created_at) VALUES ('email', '{}', now() - interval '90 seconds'), ('email', '{}', now())`); err != nil {
		t.Fatal(err)
	}

	st := statusJSON(t, url)
	unfinished := map[string]int64{}
	for _, u := range st.UnfinishedKeys {
		unfinished[u.Name] = u.Count
	}
	if unfinished["started"] != 3 || unfinished["ride_created"] != 1 || len(unfinished) != 2 {
		t.Errorf("unfinished keys: %v", unfinished)
	}
	if st.KeysPastRetention != 2 || st.StagedJobs != 2 || st.OldestStagedJobAge < 90 {
		t.Errorf("status: %+v", st)
	}
	if len(st.OpenReviews) != 1 || st.OpenReviews[0].Name != review.ReasonUnfinishedAtRetention || st.OpenReviews[0].Count != 1 {
		t.Errorf("open reviews: %+v", st.OpenReviews)
	}

	code, out, _ := run(t, "--database-url", url, "status", "--retention", "96h")
	if code != 0 {
		t.Fatal(code)
	}
	for _, want := range []string{"staged jobs (backlog)", "started", "ride_created", "keys past retention", "unfinished_at_retention", "retention 96h0m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "keys past retention  1") && !strings.Contains(out, "keys past retention\t1") {
		// tabwriter pads with spaces; accept any padding.
		fields := strings.Fields(out[strings.Index(out, "keys past retention"):])
		if len(fields) < 4 || fields[3] != "1" {
			t.Errorf("keys past 96h should be 1:\n%s", out)
		}
	}
}

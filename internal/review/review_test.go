package review_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestFlag: a review holds the key's full row; flagging again for the same
// reason while the review is open creates nothing, after it is resolved it
// creates a new one, and a missing key creates none.
func TestFlag(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var id int64
	if err := pool.QueryRow(ctx, `
INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id)
VALUES ('k-1', 'POST', '{"amount": 3}', '/rides', 'ride_created', 77) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	flag := func(reason string) bool {
		t.Helper()
		created, err := review.Flag(ctx, pool, id, reason, "5 attempts", "completer")
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	if !flag(review.ReasonCompleterGaveUp) {
		t.Fatal("the first flag created no review")
	}
	var userID int64
	var key, detail, by, point, params string
	if err := pool.QueryRow(ctx, `
SELECT user_id, idempotency_key, detail, flagged_by, snapshot->>'recovery_point', snapshot->>'request_params'
FROM idempotency_key_reviews WHERE key_id = $1`, id).Scan(&userID, &key, &detail, &by, &point, &params); err != nil {
		t.Fatal(err)
	}
	if userID != 77 || key != "k-1" || detail != "5 attempts" || by != "completer" || point != "ride_created" || params != `{"amount": 3}` {
		t.Fatalf("review: user %d key %q detail %q by %q snapshot point %q params %q", userID, key, detail, by, point, params)
	}
	if flag(review.ReasonCompleterGaveUp) {
		t.Fatal("a second open review for the same reason was created")
	}
	if !flag(review.ReasonUnfinishedAtRetention) {
		t.Fatal("a review for another reason was not created")
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_key_reviews SET resolved_at = now(), resolved_by = 'ops' WHERE key_id = $1 AND reason = $2`, id, review.ReasonCompleterGaveUp); err != nil {
		t.Fatal(err)
	}
	if !flag(review.ReasonCompleterGaveUp) {
		t.Fatal("after the review was resolved, flagging again created nothing")
	}
	if created, err := review.Flag(ctx, pool, id+1000, review.ReasonCompleterGaveUp, "", "completer"); err != nil || created {
		t.Fatalf("flagging a missing key: %v, %v", created, err)
	}
}

// TestOpen counts only unresolved reviews, by reason, with the oldest's age
// by the database clock.
func TestOpen(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	for i, reason := range []string{review.ReasonCompleterGaveUp, review.ReasonCompleterGaveUp, review.ReasonUnfinishedAtRetention} {
		var id int64
		if err := pool.QueryRow(ctx, `
INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id)
VALUES ($1, 'POST', '{}', '/rides', 'started', 1) RETURNING id`, fmt.Sprintf("k-%d", i)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := review.Flag(ctx, pool, id, reason, "", "test"); err != nil {
			t.Fatal(err)
		}
	}
	// One gave-up review is an hour old, the retention one resolved.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_key_reviews SET flagged_at = now() - interval '1 hour'
WHERE id = (SELECT min(id) FROM idempotency_key_reviews)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_key_reviews SET resolved_at = now(), resolved_by = 'ops' WHERE reason = $1`, review.ReasonUnfinishedAtRetention); err != nil {
		t.Fatal(err)
	}
	open, err := review.Open(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 || open[0].Reason != review.ReasonCompleterGaveUp || open[0].Count != 2 {
		t.Fatalf("open reviews: %+v, want 2 %s", open, review.ReasonCompleterGaveUp)
	}
	if open[0].Age < 59*time.Minute || open[0].Age > 2*time.Hour {
		t.Fatalf("oldest open review's age %s, want about an hour", open[0].Age)
	}
}

package ctl_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/operator"
)

// addDead inserts a dead letter as the enqueuer writes one.
func addDead(t *testing.T, pool *pgxpool.Pool, id int64, kind, reason, age string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO staged_jobs_dead (id, created_at, job_name, job_args, queue, priority, max_attempts, tags, metadata, reason, dead_at)
VALUES ($1, now() - $4::interval, $2, '{"ride_id": 7}', 'receipts', 2, 5, '{a,b}', '{"trace": "x"}', $3, now() - $4::interval)`,
		id, kind, reason, age)
	if err != nil {
		t.Fatal(err)
	}
}

func TestDeadListShowRequeue(t *testing.T) {
	url, pool := setup(t)
	db := []string{"--database-url", url}
	addDead(t, pool, 101, "send_receipt", "unknown_kind: send_receipt is not registered", "2 hours")
	addDead(t, pool, 102, "charge", "invalid_queue: queue name \"bad queue\"", "1 hour")

	code, out, errs := run(t, append(db, "dead", "list")...)
	if code != 0 || !strings.Contains(out, "send_receipt") || !strings.Contains(out, "charge") || strings.Index(out, "101") > strings.Index(out, "102") {
		t.Fatalf("list: exit %d\n%s%s", code, out, errs)
	}
	var dead []operator.DeadJob
	code, out, _ = run(t, append(db, "dead", "list", "--reason", "unknown_kind", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &dead); code != 0 || err != nil || len(dead) != 1 || dead[0].ID != 101 || dead[0].Kind != "send_receipt" {
		t.Fatalf("list json: exit %d %v %s", code, err, out)
	}
	code, out, _ = run(t, append(db, "dead", "list", "--kind", "nope", "-o", "json")...)
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("empty list json: %q", out)
	}

	code, out, errs = run(t, append(db, "dead", "show", "101")...)
	if code != 0 || !strings.Contains(out, "dead-lettered") || !strings.Contains(out, `{"ride_id": 7}`) || !strings.Contains(out, "requeue: idemctl dead requeue 101") {
		t.Fatalf("show: exit %d\n%s%s", code, out, errs)
	}

	t.Setenv("IDEMD_OPERATOR", "")
	if code, _, errs := run(t, append(db, "dead", "requeue", "101", "--note", "kind deployed")...); code != 2 || !strings.Contains(errs, "--by") {
		t.Fatalf("requeue without --by: exit %d, %s", code, errs)
	}
	code, out, errs = run(t, append(db, "dead", "requeue", "101", "--by", "bob", "--note", "receipts worker deployed")...)
	if code != 0 || !strings.Contains(out, "staged job 101 requeued into staged_jobs by bob") {
		t.Fatalf("requeue: exit %d\n%s%s", code, out, errs)
	}
	// Oracle: the row moved whole, once, and the move is recorded.
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs WHERE id = 101 AND job_name = 'send_receipt' AND job_args = '{"ride_id": 7}'
AND queue = 'receipts' AND priority = 2 AND max_attempts = 5 AND tags = '{a,b}' AND metadata = '{"trace": "x"}'`); n != 1 {
		t.Fatalf("staged rows for 101: %d", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs_dead WHERE id = 101"); n != 0 {
		t.Fatal("dead letter still there")
	}
	if n := count(t, pool, `SELECT count(*) FROM idemd_operator_actions WHERE action = 'dead_requeue' AND staged_job_id = 101
AND actor = 'bob' AND via = 'idemctl' AND note = 'receipts worker deployed' AND detail->>'reason' LIKE 'unknown_kind:%'`); n != 1 {
		t.Fatal("requeue not recorded")
	}
	// A second requeue finds nothing and changes nothing.
	code, _, errs = run(t, append(db, "dead", "requeue", "101", "102", "--by", "bob", "--note", "again")...)
	if code != 3 || !strings.Contains(errs, "no dead-lettered staged job 101") {
		t.Fatalf("second requeue: exit %d, %s", code, errs)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs WHERE id IN (101, 102)"); n != 2 {
		t.Fatalf("staged rows after second requeue (102 still moves): %d", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM idemd_operator_actions"); n != 2 {
		t.Fatalf("actions: %d", n)
	}

	// Show still answers for a requeued id: where it is and who moved it.
	var rep operator.DeadReport
	code, out, _ = run(t, append(db, "dead", "show", "101", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Dead != nil || !rep.Staged || len(rep.Actions) != 1 || rep.Actions[0].Actor != "bob" {
		t.Fatalf("show requeued: exit %d %v %s", code, err, out)
	}
	if code, _, errs := run(t, append(db, "dead", "show", "424242")...); code != 3 || !strings.Contains(errs, "not found") {
		t.Fatalf("show unknown: exit %d %s", code, errs)
	}
}

// TestDeadRequeueConcurrent: two requeues of one dead letter at once move
// it exactly once.
func TestDeadRequeueConcurrent(t *testing.T) {
	_, pool := setup(t)
	ctx := context.Background()
	for round := range 20 {
		id := int64(1000 + round)
		addDead(t, pool, id, "k", "unknown_kind: k", "1 minute")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = operator.RequeueDead(ctx, pool, id, operator.Actor{By: "op" + string(rune('a'+i)), Via: operator.ViaIdemctl}, "race")
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, operator.ErrNotFound):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d requeues succeeded: %v", round, ok, errs)
		}
		if n := count(t, pool, "SELECT count(*) FROM staged_jobs WHERE id = $1", id); n != 1 {
			t.Fatalf("round %d: %d staged rows", round, n)
		}
		if n := count(t, pool, "SELECT count(*) FROM idemd_operator_actions WHERE staged_job_id = $1", id); n != 1 {
			t.Fatalf("round %d: %d actions", round, n)
		}
	}
}

// Two dead letters of one staged id (a row staged with an explicit id, or
// staged again under a kept dead letter's id) are both kept: show reports
// the newest and counts the older, requeue moves the newest, and once
// that one has left staged_jobs the older is requeued in its turn.
func TestDeadLettersSharingAnID(t *testing.T) {
	url, pool := setup(t)
	db := []string{"--database-url", url}
	addDead(t, pool, 201, "older", "unknown_kind: older", "2 hours")
	addDead(t, pool, 201, "newer", "unknown_kind: newer", "1 hour")

	var rep operator.DeadReport
	code, out, _ := run(t, append(db, "dead", "show", "201", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Dead == nil || rep.Dead.Kind != "newer" || rep.OlderDead != 1 {
		t.Fatalf("show: exit %d %v %s", code, err, out)
	}
	code, out, errs := run(t, append(db, "dead", "show", "201")...)
	if code != 0 || !strings.Contains(out, "older dead letters") {
		t.Fatalf("show: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, append(db, "dead", "requeue", "201", "--by", "bob", "--note", "newer fixed")...)
	if code != 0 || !strings.Contains(out, "staged job 201 requeued") {
		t.Fatalf("requeue: exit %d\n%s%s", code, out, errs)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs WHERE id = 201 AND job_name = 'newer'"); n != 1 {
		t.Fatalf("%d staged rows of the newer dead letter", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM staged_jobs_dead WHERE id = 201 AND job_name = 'older'"); n != 1 {
		t.Fatalf("%d older dead letters kept, want 1", n)
	}
	// The older one waits while its id is staged, then goes in turn.
	if code, _, errs := run(t, append(db, "dead", "requeue", "201", "--by", "bob", "--note", "older too")...); code == 0 {
		t.Fatalf("requeue while 201 is staged: exit 0, %s", errs)
	}
	if _, err := pool.Exec(context.Background(), "DELETE FROM staged_jobs WHERE id = 201"); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, append(db, "dead", "requeue", "201", "--by", "bob", "--note", "older too")...)
	if code != 0 || count(t, pool, "SELECT count(*) FROM staged_jobs WHERE id = 201 AND job_name = 'older'") != 1 ||
		count(t, pool, "SELECT count(*) FROM staged_jobs_dead WHERE id = 201") != 0 {
		t.Fatalf("requeue of the older: exit %d\n%s%s", code, out, errs)
	}
}

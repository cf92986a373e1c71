package completer

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/lowwater"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMarkDecision(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(min int, id int64) position {
		return position{At: t0.Add(time.Duration(min) * time.Minute), ID: id}
	}
	ptr := func(p position) *position { return &p }
	bound := t0.Add(10 * time.Minute)
	atBound := position{At: bound, ID: math.MinInt64}
	for _, c := range []struct {
		name     string
		st       markState
		force    bool
		wantFrom position
		wantFull bool
		read     markReading
		wantMark position
		wantGaps int
	}{
		{name: "first pass: from the start, mark at the lowest tracked row",
			st: markState{}, wantFrom: walkStart, wantFull: true,
			read: markReading{lowest: ptr(at(1, 7)), bound: bound}, wantMark: at(1, 7)},
		{name: "marked pass: from the mark, which moves up to the lowest tracked row",
			st: markState{mark: at(1, 7), reads: lowwater.Reads{Done: 1}}, wantFrom: at(1, 7),
			read: markReading{lowest: ptr(at(3, 2)), bound: bound}, wantMark: at(3, 2)},
		{name: "the mark stays at a tracked row that is not due (it is a position, not a due filter)",
			st: markState{mark: at(1, 7), reads: lowwater.Reads{Done: 5}}, wantFrom: at(1, 7),
			read: markReading{lowest: ptr(at(1, 7)), bound: bound}, wantMark: at(1, 7)},
		{name: "never past now() - grace - margin: a key still being inserted may commit below",
			st: markState{mark: at(1, 7), reads: lowwater.Reads{Done: 2}}, wantFrom: at(1, 7),
			read: markReading{lowest: ptr(at(12, 1)), bound: bound}, wantMark: atBound},
		{name: "nothing tracked: the bound",
			st: markState{mark: at(1, 7), reads: lowwater.Reads{Done: 2}}, wantFrom: at(1, 7),
			read: markReading{bound: bound}, wantMark: atBound},
		{name: "every lowwater.FullEvery-th pass from the start; keys found below the old mark are gaps and lower it",
			st: markState{mark: at(5, 1), reads: lowwater.Reads{Done: lowwater.FullEvery}}, wantFrom: walkStart, wantFull: true,
			read: markReading{lowest: ptr(at(-60, 3)), bound: bound, below: 2}, wantMark: at(-60, 3), wantGaps: 2},
		{name: "--once: from the start whatever the count",
			st: markState{mark: at(5, 1), reads: lowwater.Reads{Done: 3}}, force: true, wantFrom: walkStart, wantFull: true,
			read: markReading{lowest: ptr(at(5, 1)), bound: bound}, wantMark: at(5, 1)},
		{name: "no mark yet (walkStart): from the start, no gaps counted",
			st: markState{mark: walkStart, reads: lowwater.Reads{Done: 4}}, wantFrom: walkStart, wantFull: true,
			read: markReading{lowest: ptr(at(2, 2)), bound: bound, below: 9}, wantMark: at(2, 2)},
		{name: "a database clock that went back lowers the mark (lower is always safe)",
			st: markState{mark: at(20, 1), reads: lowwater.Reads{Done: 1}}, wantFrom: at(20, 1),
			read: markReading{lowest: ptr(at(20, 1)), bound: bound}, wantMark: atBound},
	} {
		t.Run(c.name, func(t *testing.T) {
			from, full := planRead(c.st, c.force)
			if from != c.wantFrom || full != c.wantFull {
				t.Fatalf("planRead = %v %v, want %v %v", from, full, c.wantFrom, c.wantFull)
			}
			next, gaps := nextMark(c.st, full, c.read)
			if !next.mark.At.Equal(c.wantMark.At) || next.mark.ID != c.wantMark.ID || gaps != c.wantGaps {
				t.Fatalf("nextMark = %v, %d gaps; want %v, %d", next.mark, gaps, c.wantMark, c.wantGaps)
			}
			if next.reads.Done != c.st.reads.Done+1 {
				t.Fatalf("reads %d, want %d", next.reads.Done, c.st.reads.Done+1)
			}
		})
	}
}

// explainBuffers runs sql under EXPLAIN (ANALYZE, BUFFERS) twice, in a
// transaction begun as the completer begins its walks (lowwater.BeginSQL) and
// rolled back, and returns the shared buffers (hit + read) of the second
// run's plan.
func explainBuffers(t *testing.T, pool *pgxpool.Pool, sql string, args pgx.NamedArgs) int {
	t.Helper()
	ctx := context.Background()
	var n int
	for range 2 {
		var out []byte
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: lowwater.BeginSQL})
		if err != nil {
			t.Fatal(err)
		}
		err = tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args).Scan(&out)
		_ = tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal(out, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan %s: %v", out, err)
		}
		n = plan[0].Plan.Hit + plan[0].Plan.Read
	}
	return n
}

// deadRowsUnderSnapshot builds the held-snapshot situation of issue 16:
// a REPEATABLE READ transaction holds its snapshot while dead keys are
// tracked, finished and pruned (their rows stay in the index), then 10
// abandoned keys are inserted after them. It returns the shared buffers a
// claim's walk, and the mark read of a marked pass, read from the mark and
// from the start of the index.
func deadRowsUnderSnapshot(t *testing.T, dead int) (claimFromMark, markRead, claimFromStart, gaugeFromMark, gaugeFromStart int) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	holder, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, "SELECT count(*) FROM idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params,
                              recovery_point, created_at, last_run_at, locked_at)
SELECT 'dead-' || g, 1 + g % 7, 'POST', '/charges', '{}', 'started',
       now() - interval '3 hours' + g * interval '1 millisecond', now() - interval '3 hours', NULL
FROM generate_series(1, $1) g`, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'finished' WHERE idempotency_key LIKE 'dead-%'`); err != nil {
		t.Fatal(err)
	}
	svc := newTestService(t, pool, testConfig("http://127.0.0.1:1"))
	if n, err := svc.Prune(ctx); err != nil || n != dead {
		t.Fatalf("pruned %d (%v), want %d", n, err, dead)
	}
	insertKeys(t, pool, "live", 10, "started")
	// Statistics as autovacuum's ANALYZE would leave them (it may not have
	// run yet in a test).
	owner := dbtest.MigratorPool(t, pool)
	for _, table := range []string{"idempotency_keys", "idemd_unfinished_keys"} {
		if _, err := owner.Exec(ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	// The first pass's read, from the start, sets the mark; the claims
	// measured are the ones of the passes after it.
	if _, err := svc.startWalks(ctx, false); err != nil {
		t.Fatal(err)
	}
	var liveAt time.Time
	if err := pool.QueryRow(ctx, `SELECT min(created_at) FROM idempotency_keys WHERE idempotency_key LIKE 'live-%'`).Scan(&liveAt); err != nil {
		t.Fatal(err)
	}
	if mark := svc.walk.state.mark; !mark.At.Equal(liveAt) {
		t.Fatalf("mark at %v, want the first live key's %v", mark.At, liveAt)
	}
	args := svc.candidateArgs(50)
	claimFromMark = explainBuffers(t, pool, candidateFromSQL, args)
	markRead = explainBuffers(t, pool, markSQL, pgx.NamedArgs{
		"grace": svc.cfg.Grace, "margin": markMargin,
		"from_at": svc.walk.state.mark.At, "from_id": svc.walk.state.mark.ID,
		"below_at": walkStart.At, "below_id": walkStart.ID,
	})
	args["from_at"], args["from_id"] = walkStart.At, walkStart.ID
	claimFromStart = explainBuffers(t, pool, candidateFromSQL, args)
	mark := svc.walk.state.mark
	gaugeFromMark = explainBuffers(t, pool, unfinishedKeysSQL, pgx.NamedArgs{"from_at": mark.At, "from_id": mark.ID})
	gaugeFromStart = explainBuffers(t, pool, unfinishedKeysSQL, pgx.NamedArgs{"from_at": walkStart.At, "from_id": walkStart.ID})
	// The gauges from the mark count every live key.
	if err := svc.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(svc.metrics.pending.WithLabelValues("started")); n != 10 {
		t.Fatalf("keys pending at started = %v, want the 10 live ones", n)
	}
	// The claim still claims every live key.
	keys, err := svc.claim(ctx, 50)
	if err != nil || len(keys) != 10 {
		t.Fatalf("claimed %d keys (%v), want the 10 live ones", len(keys), err)
	}
	return claimFromMark, markRead, claimFromStart, gaugeFromMark, gaugeFromStart
}

// Under a held snapshot, a claim, a mark read and the backlog gauges from
// the mark read as many buffers with 20k dead rows below the mark as with
// 1k; from the start of the index they grow with the dead rows (which
// shows they are there).
func TestMarkSkipsDeadRows(t *testing.T) {
	claim1k, read1k, start1k, gauge1k, gaugeStart1k := deadRowsUnderSnapshot(t, 1000)
	claim20k, read20k, start20k, gauge20k, gaugeStart20k := deadRowsUnderSnapshot(t, 20000)
	t.Logf("buffers: claim from the mark %d / %d, mark read %d / %d, claim from the start %d / %d, gauges from the mark %d / %d, from the start %d / %d (1k / 20k dead rows)",
		claim1k, claim20k, read1k, read20k, start1k, start20k, gauge1k, gauge20k, gaugeStart1k, gaugeStart20k)
	if start20k < start1k+50 {
		t.Fatalf("from the start: %d buffers with 20k dead rows, %d with 1k: the dead rows are not in the walk", start20k, start1k)
	}
	if gaugeStart20k < gaugeStart1k+50 {
		t.Fatalf("gauges from the start: %d buffers with 20k dead rows, %d with 1k: the dead rows are not in the walk", gaugeStart20k, gaugeStart1k)
	}
	const slack = 5
	if claim20k > claim1k+slack {
		t.Errorf("a claim from the mark read %d buffers with 20k dead rows, %d with 1k", claim20k, claim1k)
	}
	if read20k > read1k+slack {
		t.Errorf("a mark read from the mark read %d buffers with 20k dead rows, %d with 1k", read20k, read1k)
	}
	if gauge20k > gauge1k+slack {
		t.Errorf("the gauges from the mark read %d buffers with 20k dead rows, %d with 1k", gauge20k, gauge1k)
	}
}

// A key committed below the mark (its transaction began long before and
// committed after the mark passed its created_at) is not claimed by the
// marked passes and is claimed by the next full one, and counted.
func TestLateKeyBelowMark(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	api := newTestAPI(t, pool, always(actFinish))
	svc := newTestService(t, pool, testConfig(api.srv.URL))
	// A key backing off: tracked, not due. It holds the mark.
	insertKeys(t, pool, "hold", 1, "started")
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_next_attempt_at = now() + interval '1 hour' WHERE idempotency_key = 'hold-1'`); err != nil {
		t.Fatal(err)
	}
	var hold position
	if err := pool.QueryRow(ctx, `SELECT created_at, key_id FROM idemd_unfinished_keys`).Scan(&hold.At, &hold.ID); err != nil {
		t.Fatal(err)
	}
	res, err := svc.pass(ctx, lifecycle.Stop{})
	if err != nil || res.Claimed != 0 {
		t.Fatalf("first pass: %+v %v", res, err)
	}
	if got := svc.walk.state.mark; got.ID != hold.ID || !got.At.Equal(hold.At) {
		t.Fatalf("mark %v, want the key backing off %v", got, hold)
	}
	// The late key: created two hours ago, committed now. A key above the
	// mark, inserted with it, is claimed by the next (marked) pass.
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params,
                              recovery_point, created_at, last_run_at)
VALUES ('late-1', 1, 'POST', '/charges', '{}', 'started', now() - interval '2 hours', now() - interval '2 hours'),
       ('fresh-1', 1, 'POST', '/charges', '{}', 'started', now() - interval '30 minutes', now() - interval '30 minutes')`); err != nil {
		t.Fatal(err)
	}
	// The backlog gauges count from the mark too: the key below it is
	// missed until a full walk finds it (the price of not walking the
	// dead entries below the mark every poll interval).
	if err := svc.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(svc.metrics.pending.WithLabelValues("started")); n != 2 {
		t.Fatalf("keys pending at started = %v before the full walk, want 2 (hold-1, fresh-1; late-1 is below the mark)", n)
	}
	for svc.walk.state.reads.Done%lowwater.FullEvery != 0 {
		res, err := svc.pass(ctx, lifecycle.Stop{})
		if err != nil {
			t.Fatal(err)
		}
		if k := getKey(t, pool, "late-1"); k.RecoveryPoint != "started" || k.Attempts != 0 || k.Leased != nil {
			t.Fatalf("pass %d claimed the key below the mark: %+v", svc.walk.state.reads.Done, k)
		}
		if got := svc.walk.state.mark; got.ID != hold.ID {
			t.Fatalf("the mark moved to %v", got)
		}
		_ = res
	}
	if k := getKey(t, pool, "fresh-1"); k.RecoveryPoint != "finished" {
		t.Fatalf("the key above the mark was not finished by the marked passes: %+v", k)
	}
	if n := testutil.ToFloat64(svc.metrics.keysBelowMark); n != 0 {
		t.Fatalf("keys below the mark counted before the full pass: %v", n)
	}
	res, err = svc.pass(ctx, lifecycle.Stop{})
	if err != nil || res.Finished != 1 {
		t.Fatalf("full pass: %+v %v", res, err)
	}
	if k := getKey(t, pool, "late-1"); k.RecoveryPoint != "finished" {
		t.Fatalf("the full pass did not finish the key below the mark: %+v", k)
	}
	if n := testutil.ToFloat64(svc.metrics.keysBelowMark); n != 1 {
		t.Fatalf("idemd_completer_keys_below_mark_total = %v, want 1", n)
	}
	// Prune from the mark removes the row at the mark itself.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'finished' WHERE idempotency_key = 'hold-1'`); err != nil {
		t.Fatal(err)
	}
	if n, err := svc.prune(ctx, hold); err != nil || n != 1 {
		t.Fatalf("prune from the mark deleted %d (%v), want the row at the mark", n, err)
	}
}

package enqueuer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// genRow is one generated staged row, as SQL literals (NULL for none).
type genRow struct {
	kind, args, queue, priority, maxAttempts, scheduledAt, createdAt, tags, metadata string
}

// The values a plain-SQL stager can write, on every edge River's client
// and River's table have, and past them.
var genValues = struct {
	kind, args, queue, priority, maxAttempts, scheduledAt, createdAt, tags, metadata []string
}{
	kind: []string{`'send_receipt'`, `''`, `repeat('k', 127)`, `repeat('k', 128)`, `repeat('é', 63)`, `repeat('é', 64)`,
		`repeat('é', 127)`, `'kind with spaces'`, `'日本語の種類'`, `'a.b/c:d'`},
	args: []string{`'{}'`, `'{"ride_id": 1}'`, `'[]'`, `'"s"'`, `'null'`, `'1'`, `'{"nested": {"a": [1, 2, null]}}'`,
		`jsonb_build_object('s', repeat('x', 5000))`},
	queue: []string{`NULL`, `'default'`, `'mail_2-x'`, `''`, `repeat('q', 64)`, `repeat('q', 65)`, `'Bad Queue'`,
		`'é'`, `'a__b'`, `'-a'`},
	priority:    []string{`NULL`, `1`, `4`, `5`, `-1`, `100`},
	maxAttempts: []string{`NULL`, `1`, `25`, `32767`, `32768`, `-1`, `100000`},
	scheduledAt: []string{`NULL`, `'infinity'`, `'-infinity'`, `'0001-01-01 00:00:00+00'`, `'0001-01-01 01:00:00+00'`,
		`'9999-12-31 23:59:59.999999+00'`, `'10000-01-01 00:00:00+00'`, `'0044-03-15 00:00:00+00 BC'`,
		`now() + interval '1 hour'`, `now() - interval '1 hour'`},
	createdAt: []string{`now()`, `now()`, `now()`, `'infinity'`, `'-infinity'`, `'0001-01-01 00:00:00+00'`, `'12000-01-01 00:00:00+00'`},
	tags: []string{`NULL`, `'{}'`, `'{ride,receipt}'`, `'{abc,NULL}'`, `'{{abc,def},{ghi,jkl}}'`, `ARRAY[repeat('t', 255)]`,
		`ARRAY[repeat('t', 256)]`, `'{"a b c"}'`, `'{ab}'`, `'[0:1]={abc,def}'`},
	metadata: []string{`NULL`, `'{}'`, `'{"trace": "abc"}'`, `'[]'`, `'null'`, `'1'`},
}

func pick(rng *rand.Rand, from []string) string { return from[rng.IntN(len(from))] }

// riverHolds inserts row r with River's own client, InsertManyTx, under a
// savepoint of tx, as an API written with River would have inserted it,
// and reads the job back with River's client and as JSON (riverui, any
// API that lists jobs): nil when River takes the job and can read it back,
// else why not. A value River's Go API cannot even express (an infinite
// time, a NULL tag, tags of two dimensions) is a refusal.
func riverHolds(ctx context.Context, rc *river.Client[pgx.Tx], tx pgx.Tx, r *riverdb.StagedRow) (err error) {
	if r.ScheduledAt.Valid && r.ScheduledAt.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("scheduled_at %s: no time.Time holds it", riverdb.TimeString(r.ScheduledAt))
	}
	if len(r.Tags.Dims) > 1 {
		return fmt.Errorf("tags of %d dimensions: no []string holds them", len(r.Tags.Dims))
	}
	opts := &river.InsertOpts{Metadata: r.Metadata, ScheduledAt: r.ScheduledAtOrZero()}
	if r.Tags.Valid {
		opts.Tags = []string{}
		for _, t := range r.Tags.Elements {
			if t == nil {
				return fmt.Errorf("a NULL tag: no []string holds it")
			}
			opts.Tags = append(opts.Tags, *t)
		}
	}
	if r.Queue != nil {
		if *r.Queue == "" {
			return fmt.Errorf("queue '': River's InsertOpts take it for the default queue")
		}
		opts.Queue = *r.Queue
	}
	if r.Priority != nil {
		opts.Priority = int(*r.Priority)
	}
	if r.MaxAttempts != nil {
		opts.MaxAttempts = int(*r.MaxAttempts)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	defer sp.Rollback(ctx) //nolint:errcheck // River's job is only tried
	res, err := rc.InsertManyTx(ctx, sp, []river.InsertManyParams{{Args: riverdb.StagedArgs{KindName: r.Kind, Args: r.Args}, InsertOpts: opts}})
	if err != nil {
		return fmt.Errorf("InsertManyTx: %w", err)
	}
	job, err := rc.JobGetTx(ctx, sp, res[0].Job.ID)
	if err != nil {
		return fmt.Errorf("JobGetTx: %w", err)
	}
	if _, err := json.Marshal(job); err != nil {
		return fmt.Errorf("the job as JSON: %w", err)
	}
	return nil
}

// A randomized comparison of the move with River's own insert on the same
// rows: every row the move (either path) writes into River is one River's
// InsertManyTx takes and a River client reads back; a row the move refuses
// that River would take is refused by one of idemd's documented stricter
// rules (args and metadata must be JSON objects, a kind at most 127
// bytes, created_at a time River's clients could read, a max_attempts
// River would clamp to 32767 without a word); every row ends in River or in staged_jobs_dead with a reason
// that names its field; and River's client lists every job afterwards,
// which is what its scheduler and riverui do.
func TestMoveAcceptsWhatRiverAccepts(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	rng := rand.New(rand.NewPCG(39, 1))
	const n = 600
	var sb strings.Builder
	sb.WriteString(`INSERT INTO staged_jobs (job_name, job_args, queue, priority, max_attempts, scheduled_at, created_at, tags, metadata) VALUES `)
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		g := genRow{pick(rng, genValues.kind), pick(rng, genValues.args), pick(rng, genValues.queue), pick(rng, genValues.priority),
			pick(rng, genValues.maxAttempts), pick(rng, genValues.scheduledAt), pick(rng, genValues.createdAt), pick(rng, genValues.tags),
			pick(rng, genValues.metadata)}
		// Most rows valid, so the batches mix valid rows with bad ones.
		if rng.IntN(3) == 0 {
			g = genRow{`'send_receipt'`, `'{"n": ` + fmt.Sprint(i) + `}'`, "NULL", "NULL", "NULL", "NULL", "now()", "NULL", "NULL"}
		}
		fmt.Fprintf(&sb, "(%s, %s, %s, %s, %s, %s, %s, %s, %s)", g.kind, g.args, g.queue, g.priority, g.maxAttempts, g.scheduledAt, g.createdAt, g.tags, g.metadata)
	}
	if _, err := pool.Exec(ctx, sb.String()); err != nil {
		t.Fatal(err)
	}

	// River's verdict on each row, inside a transaction rolled back.
	reference, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool, func(c *Settings) { c.BatchSize = 7 })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `SELECT id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, unique_key, unique_states,
    `+riverdb.ValidSQL+` FROM staged_jobs ORDER BY id`, s.moveArgs(fullPass, fullPass, riverNewest))
	if err != nil {
		t.Fatal(err)
	}
	type verdict struct {
		row      riverdb.StagedRow
		sqlValid bool
		goWhy    *riverdb.Invalid
	}
	var staged []verdict
	for rows.Next() {
		var v verdict
		r := &v.row
		if err := rows.Scan(&r.ID, &r.CreatedAt, &r.Kind, &r.Args, &r.Queue, &r.Priority, &r.MaxAttempts, &r.ScheduledAt, &r.Tags, &r.Metadata,
			&r.UniqueKey, &r.UniqueStates, &v.sqlValid); err != nil {
			t.Fatal(err)
		}
		v.goWhy = s.valid.Check(r)
		staged = append(staged, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	riverTakes := map[int64]error{}
	// created_at is idemd's (when the row was staged), which River's
	// insert never sees.
	stricter := map[string]bool{riverdb.ReasonInvalidArgs: true, riverdb.ReasonInvalidMeta: true, riverdb.ReasonInvalidKind: true, riverdb.ReasonInvalidCreated: true}
	agree, idemdStricter := 0, 0
	for _, v := range staged {
		rerr := riverHolds(ctx, reference, tx, &v.row)
		riverTakes[v.row.ID] = rerr
		if v.sqlValid != (v.goWhy == nil) {
			t.Errorf("row %d: the move's SQL says valid %v, its Go validator %v", v.row.ID, v.sqlValid, v.goWhy)
		}
		switch {
		case v.goWhy == nil && rerr != nil:
			t.Errorf("row %d (kind %q, queue %v, scheduled_at %s, tags %+v): the move takes it, River does not: %v",
				v.row.ID, v.row.Kind, v.row.Queue, riverdb.TimeString(v.row.ScheduledAt), v.row.Tags, rerr)
		case v.goWhy != nil && rerr == nil:
			// River's driver clamps a max_attempts above 32767 to 32767
			// without a word; the move refuses to change what was staged.
			clamped := v.goWhy.Code == riverdb.ReasonInvalidMaxAtt && *v.row.MaxAttempts > 32767
			if !stricter[v.goWhy.Code] && !clamped {
				t.Errorf("row %d: the move refuses it (%v), River takes it, and that is not one of idemd's stricter rules", v.row.ID, v.goWhy)
			}
			idemdStricter++
		default:
			agree++
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Both verdicts must be common, or the comparison proves little.
	var valid int
	for _, v := range staged {
		if v.goWhy == nil {
			valid++
		}
	}
	if valid < 150 || n-valid < 150 {
		t.Fatalf("%d valid and %d invalid rows of %d, want at least 150 of each", valid, n-valid, n)
	}
	t.Logf("%d rows: %d verdicts agree with River's, %d refused by idemd's stricter rules", n, agree, idemdStricter)

	// The enqueuer moves them all, in batches of 7 that mix valid and bad.
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if left := count(t, pool, `SELECT count(*) FROM staged_jobs`); left != 0 {
		t.Fatalf("%d rows left staged after a drain (%+v)", left, res)
	}
	// The oracle: each staged id is exactly one River job xor one dead row,
	// and which one is the validator's verdict.
	for _, v := range staged {
		var jobs, dead int
		var reason *string
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM river_job WHERE (metadata->>'idemd_staged_id')::bigint = $1),
    (SELECT count(*) FROM staged_jobs_dead WHERE id = $1), (SELECT reason FROM staged_jobs_dead WHERE id = $1)`, v.row.ID).Scan(&jobs, &dead, &reason); err != nil {
			t.Fatal(err)
		}
		want := "a River job"
		if v.goWhy != nil {
			want = "dead-lettered as " + v.goWhy.Code
		}
		switch {
		case jobs+dead != 1:
			t.Errorf("row %d: %d River jobs and %d dead rows, want one of them (%s)", v.row.ID, jobs, dead, want)
		case v.goWhy == nil && jobs != 1, v.goWhy != nil && (dead != 1 || !strings.HasPrefix(*reason, v.goWhy.Code+": ")):
			t.Errorf("row %d: %d jobs, dead reason %v; want %s", v.row.ID, jobs, reason, want)
		}
	}
	// River's client reads every job back, the way its scheduler and
	// riverui list them.
	assertRiverReadsEveryJob(ctx, t, pool)
}

// assertRiverReadsEveryJob lists every River job with River's client, in
// every state, and encodes each as JSON.
func assertRiverReadsEveryJob(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	total := count(t, pool, `SELECT count(*) FROM river_job`)
	params := river.NewJobListParams().First(10000).States(rivertype.JobStateAvailable, rivertype.JobStateScheduled,
		rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateRetryable, rivertype.JobStateCompleted,
		rivertype.JobStateCancelled, rivertype.JobStateDiscarded)
	list, err := rc.JobList(ctx, params)
	if err != nil {
		t.Fatalf("River's JobList over %d jobs: %v", total, err)
	}
	if int64(len(list.Jobs)) != total {
		t.Fatalf("River's JobList read %d jobs of %d", len(list.Jobs), total)
	}
	for _, j := range list.Jobs {
		if _, err := json.Marshal(j); err != nil {
			t.Fatalf("job %d as JSON: %v", j.ID, err)
		}
	}
}

// One bad staged row costs only itself: rows staged with infinite and
// out-of-range scheduled_at among valid ones (and a NULL tag, which once
// failed the Go path's scan) are dead-lettered, every valid row beside and
// after them is moved, and a River client keeps working: its scheduler
// makes a job the API scheduled with River's own InsertTx available and
// its worker works it with the moved jobs.
func TestBadTimesDoNotStopRiver(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args, scheduled_at, tags)
SELECT 'idemd_test_work', jsonb_build_object('n', g),
       CASE g % 6 WHEN 1 THEN '-infinity'::timestamptz WHEN 2 THEN 'infinity' WHEN 3 THEN '10000-01-01 00:00:00+00' END,
       CASE WHEN g % 6 = 4 THEN ARRAY['ok_tag', NULL] END
FROM generate_series(1, 24) g`); err != nil {
		t.Fatal(err)
	}
	w := &worker{seen: make(chan int, 64)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		FetchPollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scheduled, err := rc.InsertTx(ctx, tx, workArgs{N: 1000}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Batches of 2, so bad rows share batches with good ones.
	s := newService(t, pool, func(c *Settings) { c.BatchSize = 2 })
	res, err := s.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 8 || res.DeadLettered != 16 {
		t.Fatalf("drain: %+v, want 8 moved and 16 dead-lettered", res)
	}
	for _, c := range []struct{ reason, like string }{
		{riverdb.ReasonInvalidSchedule, "%-infinity%"}, {riverdb.ReasonInvalidSchedule, "%got infinity%"}, {riverdb.ReasonInvalidSchedule, "%10000-01-01%"},
		{riverdb.ReasonInvalidTags, "%NULL%"},
	} {
		if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead WHERE reason LIKE $1 || ': %' AND reason LIKE $2`, c.reason, c.like); n != 4 {
			t.Errorf("%d rows dead-lettered as %s (%s), want 4", n, c.reason, c.like)
		}
	}

	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rc.Stop(ctx) //nolint:errcheck
	got := map[int]bool{}
	deadline := time.After(2 * time.Minute)
	for len(got) < 9 {
		select {
		case v := <-w.seen:
			got[v] = true
		case <-deadline:
			t.Fatalf("River worked %v; want the 8 moved jobs and the scheduled one (1000)", got)
		}
	}
	if !got[1000] {
		t.Fatalf("River worked %v without the job scheduled by InsertTx", got)
	}
	testwait.Until(t, 2*time.Minute, "River's jobs completed", func() bool {
		return count(t, pool, `SELECT count(*) FROM river_job WHERE state = 'completed'`) == 9
	})
	if j, err := rc.JobGet(ctx, scheduled.Job.ID); err != nil || j.State != rivertype.JobStateCompleted {
		t.Fatalf("the scheduled job: %+v, %v", j, err)
	}
	assertRiverReadsEveryJob(ctx, t, pool)
}

package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// invoiceArgs is a kind with its own InsertOpts and unique fields, as an
// API written with River declares its jobs.
type invoiceArgs struct {
	CustomerID int    `json:"customer_id" river:"unique"`
	Month      string `json:"month" river:"unique"`
	Note       string `json:"note"`
}

func (invoiceArgs) Kind() string { return "send_invoice" }

func (invoiceArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue: "billing", Priority: 2, MaxAttempts: 7, Tags: []string{"billing", "invoice"},
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour, ByQueue: true},
	}
}

// plainArgs has no InsertOpts: River's and the client's defaults apply.
type plainArgs struct {
	N int `json:"n"`
}

func (plainArgs) Kind() string { return "plain" }

// fixedClock is River's test clock, so both inserts fall in one period.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time       { return c.t }
func (c fixedClock) NowOrNil() *time.Time { return &c.t }

// tenantMiddleware is an API's insert middleware: it stamps every job's
// metadata, as a tenant or request id middleware does.
type tenantMiddleware struct {
	river.JobInsertMiddlewareDefaults
}

func (*tenantMiddleware) InsertMany(ctx context.Context, many []*rivertype.JobInsertParams, doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
	for _, p := range many {
		p.Metadata = []byte(`{"tenant": "acme"}`)
	}
	return doInner(ctx)
}

// job is a river_job row with what may differ between two inserts of the
// same job left out (id, times, idemd's trace metadata).
type job struct {
	Kind, Queue, State, Args, Metadata string
	Priority, MaxAttempts              int
	Tags                               []string
	UniqueKey                          []byte
	UniqueStates                       string // "" when NULL
}

func riverJobs(t *testing.T, pool *pgxpool.Pool) []job {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT kind, queue, state::text, args::text, (metadata - 'idemd_staged_id' - 'idemd_staged_at')::text, priority, max_attempts, tags::text[], unique_key, coalesce(unique_states::text, '')
FROM river_job ORDER BY kind, args::text, id`)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[job])
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

// insertCase is one call made four times, each in its own transaction.
type insertCase struct {
	name string
	args river.JobArgs
	opts *river.InsertOpts
}

var insertCases = []insertCase{
	{"the kind's InsertOpts and unique fields", invoiceArgs{CustomerID: 1, Month: "2026-12", Note: "first"}, nil},
	{"unique fields only: another note is the same job", invoiceArgs{CustomerID: 1, Month: "2026-12", Note: "second"}, nil},
	{"another customer", invoiceArgs{CustomerID: 2, Month: "2026-12"}, nil},
	{"the call's options over the kind's", invoiceArgs{CustomerID: 3, Month: "2026-12"},
		&river.InsertOpts{Queue: "urgent", Priority: 1, Tags: []string{"rush"},
			UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending,
				rivertype.JobStateRunning, rivertype.JobStateScheduled, rivertype.JobStateRetryable}}}},
	{"scheduled", plainArgs{N: 1}, &river.InsertOpts{ScheduledAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}},
	{"not unique: four jobs", plainArgs{N: 2}, nil},
	{"unique by kind alone", plainArgs{N: 3}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: 24 * time.Hour}}},
}

// StageInsertTx is River's InsertTx with the write deferred to the
// enqueuer: the same calls, made once through River's own InsertTx on one
// database and once staged and moved on another, give the same River jobs,
// column for column (kind, queue, priority, max attempts, tags, args,
// state, the metadata the API's insert middleware set, River's unique key
// and states), and where InsertTx keeps one
// unique job of four calls, so does staging.
func TestStageInsertTxIsRiversInsertTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := fixedClock{time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC)}
	cfg := &river.Config{MaxAttempts: 9, Test: river.TestConfig{Time: clock}, Middleware: []rivertype.Middleware{&tenantMiddleware{}}}

	byRiver := dbtest.NewPool(t)
	rc, err := river.NewClient(riverpgxv5.New(byRiver), cfg)
	if err != nil {
		t.Fatal(err)
	}
	byStaging := dbtest.NewPool(t)
	stager, err := idem.NewStager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range insertCases {
		for range 4 {
			for _, side := range []struct {
				pool   *pgxpool.Pool
				insert func(pgx.Tx) error
			}{
				{byRiver, func(tx pgx.Tx) error { _, err := rc.InsertTx(ctx, tx, c.args, c.opts); return err }},
				{byStaging, func(tx pgx.Tx) error { _, err := stager.InsertTx(ctx, tx, c.args, c.opts); return err }},
			} {
				if err := pgx.BeginFunc(ctx, side.pool, side.insert); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
			}
		}
	}
	moveAll(t, byStaging)

	want, got := riverJobs(t, byRiver), riverJobs(t, byStaging)
	// The invoices keep one job per unique key (the second case is the
	// first's job), so does the job unique by kind, and the scheduled and
	// plain cases, not unique, keep four each: 3 + 1 + 4 + 4.
	if len(want) != 12 {
		t.Fatalf("River's own InsertTx kept %d jobs, want 12", len(want))
	}
	if len(got) != len(want) {
		t.Fatalf("staging kept %d jobs, River's InsertTx %d:\nstaged: %+v\nRiver:  %+v", len(got), len(want), got, want)
	}
	for i := range want {
		w, g := fmt.Sprintf("%+v", want[i]), fmt.Sprintf("%+v", got[i])
		if w != g {
			t.Errorf("job %d:\nRiver's InsertTx: %s\nstaged:           %s", i, w, g)
		}
	}
	// The oracle for "kept once": jobs per kind and args, by SQL.
	var uniq int
	if err := byStaging.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE unique_key IS NOT NULL`).Scan(&uniq); err != nil {
		t.Fatal(err)
	}
	if uniq != 4 {
		t.Fatalf("%d unique jobs staged, want 4 (three invoices and one by kind)", uniq)
	}
	var stamped int
	if err := byStaging.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE metadata->>'tenant' = 'acme'`).Scan(&stamped); err != nil || stamped != 12 {
		t.Fatalf("%d staged jobs carry the insert middleware's metadata, want 12: %v", stamped, err)
	}
}

// errThirteen is the refusing hook's error.
var errThirteen = errors.New("tenant acme may not insert n=13")

// The API's River configuration shapes a staged job as it shapes
// InsertTx's, Plugins included (the non-deprecated home of insert
// middleware and hooks): a middleware in Plugins stamps the metadata of
// every job, and a HookInsertBegin in Plugins refuses one job with its
// own error, on River's InsertTx and through staging alike. The oracle is
// SQL: river_job column for column on both sides, and staged_jobs holding
// nothing of the refused call.
func TestStagerAppliesPluginsAndHooks(t *testing.T) {
	ctx := context.Background()
	stamp := river.JobInsertMiddlewareFunc(func(ctx context.Context, many []*rivertype.JobInsertParams,
		doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
		for _, p := range many {
			p.Metadata = []byte(`{"tenant": "acme", "by": "plugin"}`)
		}
		return doInner(ctx)
	})
	refuse := river.HookInsertBeginFunc(func(_ context.Context, p *rivertype.JobInsertParams) error {
		if a, ok := p.Args.(plainArgs); ok && a.N == 13 {
			return errThirteen
		}
		return nil
	})
	cfg := &river.Config{Plugins: []rivertype.Plugin{stamp, refuse}}

	byRiver := dbtest.NewPool(t)
	rc, err := river.NewClient(riverpgxv5.New(byRiver), cfg)
	if err != nil {
		t.Fatal(err)
	}
	byStaging := dbtest.NewPool(t)
	stager, err := idem.NewStager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 13, 2} {
		errRiver := pgx.BeginFunc(ctx, byRiver, func(tx pgx.Tx) error { _, err := rc.InsertTx(ctx, tx, plainArgs{N: n}, nil); return err })
		errStaged := pgx.BeginFunc(ctx, byStaging, func(tx pgx.Tx) error {
			_, err := stager.InsertTx(ctx, tx, plainArgs{N: n}, nil)
			return err
		})
		if n == 13 {
			if !errors.Is(errRiver, errThirteen) || !errors.Is(errStaged, errThirteen) {
				t.Errorf("n=13: InsertTx %v, staging %v: both must be the hook's refusal", errRiver, errStaged)
			}
			continue
		}
		if errRiver != nil || errStaged != nil {
			t.Fatalf("n=%d: InsertTx %v, staging %v", n, errRiver, errStaged)
		}
	}
	var staged int
	if err := byStaging.QueryRow(ctx, `SELECT count(*) FROM staged_jobs WHERE job_args->>'n' = '13'`).Scan(&staged); err != nil || staged != 0 {
		t.Fatalf("%d rows staged for the refused job: %v", staged, err)
	}
	moveAll(t, byStaging)
	want, got := riverJobs(t, byRiver), riverJobs(t, byStaging)
	if len(want) != 2 || len(got) != 2 {
		t.Fatalf("River's InsertTx kept %d jobs, staging %d; want 2 each", len(want), len(got))
	}
	for i := range want {
		w, g := fmt.Sprintf("%+v", want[i]), fmt.Sprintf("%+v", got[i])
		if w != g {
			t.Errorf("job %d:\nRiver's InsertTx: %s\nstaged:           %s", i, w, g)
		}
		if !strings.Contains(g, `"by": "plugin"`) {
			t.Errorf("job %d lacks the plugin middleware's metadata: %s", i, g)
		}
	}
}

// What staging cannot honour is refused with an error, never dropped: a
// River Schema (NewStager), and an ID an insert middleware sets (at the
// insert); nothing is staged.
func TestStagerRefusesWhatItCannotHonour(t *testing.T) {
	ctx := context.Background()
	if _, err := idem.NewStager(&river.Config{Schema: "jobs"}); err == nil || !strings.Contains(err.Error(), "Schema") {
		t.Errorf("NewStager with a Schema: %v, want a refusal naming Schema", err)
	}
	setID := river.JobInsertMiddlewareFunc(func(ctx context.Context, many []*rivertype.JobInsertParams,
		doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
		for _, p := range many {
			id := int64(424242)
			p.ID = &id
		}
		return doInner(ctx)
	})
	stager, err := idem.NewStager(&river.Config{Plugins: []rivertype.Plugin{setID}})
	if err != nil {
		t.Fatal(err)
	}
	pool := dbtest.NewPool(t)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := stager.InsertTx(ctx, tx, plainArgs{N: 1}, nil); return err })
	if err == nil || !strings.Contains(err.Error(), "ID") {
		t.Errorf("a middleware that sets the job's ID: %v, want a refusal naming ID", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows staged by a refused call: %v", n, err)
	}
}

// moveAll runs the enqueuer until staged_jobs is empty.
func moveAll(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	s, err := enqueuer.New(enqueuer.Config{Settings: enqueuer.DefaultSettings(), Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM staged_jobs`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left staged: %v", left, err)
	}
}

// River's errors are StageInsertTx's, and nothing is staged.
func TestStageInsertTxRefusesWhatInsertTxRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	for _, c := range []struct {
		name string
		opts *river.InsertOpts
		want string
	}{
		{"bad queue", &river.InsertOpts{Queue: "Bad Queue"}, "queue name is invalid"},
		{"bad priority", &river.InsertOpts{Priority: 9}, "priority must be between 1 and 4"},
		{"bad tag", &river.InsertOpts{Tags: []string{"a b"}}, "tags should match"},
		{"unique states without running", &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: []rivertype.JobState{rivertype.JobStateAvailable}}}, "required states"},
		{"pending", &river.InsertOpts{Pending: true}, "pending jobs"},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := idem.StageInsertTx(ctx, tx, plainArgs{N: 1}, c.opts)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows staged by refused calls: %v", n, err)
	}
}

// riverUniqueKey is the canonical form docs/languages/README.md writes
// down, reduced to what this test's job needs: ASCII keys and string or
// integer values, whose Go JSON is the plain JSON, and an hour period,
// whose start is the same counted from Go's zero time or from 1970. The
// whole form (escapes, floats, nested and marked fields, periods that do
// not divide a day) is held to River's InsertTx by the vectors in
// clients/testdata/unique_keys.json (clients/uniquekeys_test.go), which
// each language's helper computes.
func riverUniqueKey(kind string, args map[string]any, period time.Duration, now time.Time, queue string) []byte {
	var sb strings.Builder
	sb.WriteString("&kind=" + kind)
	if args != nil {
		keys := make([]string, 0, len(args))
		for k := range args {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		sb.WriteString("&args={")
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(",")
			}
			kb, _ := json.Marshal(k)
			vb, _ := json.Marshal(args[k])
			sb.Write(kb)
			sb.WriteString(":")
			sb.Write(vb)
		}
		sb.WriteString("}")
	}
	if period > 0 {
		sb.WriteString("&period=" + now.Truncate(period).UTC().Format(time.RFC3339))
	}
	if queue != "" {
		sb.WriteString("&queue=" + queue)
	}
	sum := sha256.Sum256([]byte(sb.String()))
	return sum[:]
}

// An API in another language stages a unique job with plain SQL, writing
// the unique key in the documented form and River's default unique
// states: it is the job River's own InsertTx makes, and four such rows,
// beside one inserted with InsertTx, keep one job.
func TestPlainSQLUniqueStagingIsRivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	clock := fixedClock{time.Now().UTC()}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Test: river.TestConfig{Time: clock}})
	if err != nil {
		t.Fatal(err)
	}
	var res *rivertype.JobInsertResult
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		res, err = rc.InsertTx(ctx, tx, invoiceArgs{CustomerID: 7, Month: "2026-12", Note: "by River"}, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	key := riverUniqueKey("send_invoice", map[string]any{"customer_id": 7, "month": "2026-12"}, time.Hour, clock.t, "billing")
	if string(key) != string(res.Job.UniqueKey) {
		t.Fatalf("the documented recipe's key %x, River's %x", key, res.Job.UniqueKey)
	}
	for range 4 {
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, queue, priority, max_attempts, tags, unique_key, unique_states)
VALUES ('send_invoice', '{"customer_id": 7, "month": "2026-12", "note": "by SQL"}', 'billing', 2, 7, '{billing,invoice}', $1, B'11110101')`, key); err != nil {
			t.Fatal(err)
		}
	}
	moveAll(t, pool)
	var jobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'send_invoice'`).Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("%d send_invoice jobs, want River's one: %v", jobs, err)
	}
	var states string
	if err := pool.QueryRow(ctx, `SELECT unique_states::text FROM river_job WHERE id = $1`, res.Job.ID).Scan(&states); err != nil || states != "11110101" {
		t.Fatalf("River's default unique states are %s, the guide says 11110101: %v", states, err)
	}
}

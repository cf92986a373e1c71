package conformance_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/conformance"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/migrations"
)

// runOnly runs the named scenarios against orderAPI with b, the kit
// reading db (nil: no database) and pinning mismatch (0: any).
func runOnly(t *testing.T, apiDB, db *pgxpool.Pool, b breaks, mismatch int, only ...string) conformance.Report {
	t.Helper()
	h, err := newOrderAPI(apiDB, []byte(testSecret), b)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := conformance.Config{APIURL: srv.URL, Template: orderTemplate(), Pool: db, MismatchStatus: mismatch, Only: only}
	rep, err := conformance.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestMismatchDialectsPass: a reused key with other parameters refused
// with 400 (Stripe), 409 (the article) or 422 (the IETF draft, idem) is
// the protocol kept; the report says which status the API chose, and
// --mismatch-status pins one.
func TestMismatchDialectsPass(t *testing.T) {
	t.Parallel()
	pool := ordersDB(t)
	for _, tc := range []struct {
		status int // the API's; 0 is idem's own, 422
		want   string
	}{
		{400, "answered 400, Stripe's choice"},
		{409, "answered 409, the article's choice"},
		{0, "answered 422, the IETF draft's and idem's choice"},
	} {
		rep := runOnly(t, pool, pool, breaks{MismatchStatus: tc.status}, 0, "params-mismatch")
		if len(rep.Results) != 1 || rep.Results[0].Outcome != conformance.Pass || rep.Results[0].Why != tc.want {
			logReport(t, rep)
			t.Errorf("API answering %d: want a pass noting %q", tc.status, tc.want)
		}
	}
	// The article's API, whole: every scenario passes, none is skipped.
	if rep := runOrders(t, pool, breaks{MismatchStatus: 409}); rep.Failed != 0 || rep.Skipped != 0 {
		logReport(t, rep)
		t.Errorf("an API answering mismatches with 409: failed %v, skipped %d", rep.FailedNames(), rep.Skipped)
	}
	rep := runOnly(t, pool, pool, breaks{MismatchStatus: 409}, 422, "params-mismatch")
	if rep.Failed != 1 || !strings.Contains(rep.Results[0].Why, "answered 409") || !strings.Contains(rep.Results[0].Why, "pins 422") {
		logReport(t, rep)
		t.Error("an API answering 409 passed --mismatch-status 422")
	}
}

// TestDatabaseWithoutIdemdSchema: pointed at a database with the
// article's tables but not idemd's migrations, the kit says so before
// any scenario reads it: each scenario that needs the tables is skipped
// naming what is missing and `idemctl migrate`; none fails on a raw
// column error, and the ones a client alone can check still run.
func TestDatabaseWithoutIdemdSchema(t *testing.T) {
	t.Parallel()
	apiDB := ordersDB(t)
	article := articleOnlyDB(t)
	rep := runOnly(t, apiDB, article, breaks{}, 0)
	logReport(t, rep)
	if rep.Failed != 0 {
		t.Fatalf("failed %v on a database without idemd's schema", rep.FailedNames())
	}
	needsDB := map[string]bool{"stored-response": true, "staged-jobs": true, "abandoned-resume": true}
	for _, res := range rep.Results {
		switch {
		case needsDB[res.Name]:
			if res.Outcome != conformance.Skip || !strings.Contains(res.Why, "request_fingerprint") || !strings.Contains(res.Why, "idemctl migrate") {
				t.Errorf("%s: %s %q, want skipped naming the missing column and idemctl migrate", res.Name, res.Outcome, res.Why)
			}
		case res.Name == "replay" || res.Name == "concurrent" || res.Name == "params-mismatch":
			if res.Outcome != conformance.Pass {
				t.Errorf("%s: %s %q, want it to run and pass without the tables", res.Name, res.Outcome, res.Why)
			}
		}
	}
}

// articleOnlyDB is a database with the article's schema and nothing of
// idemd's, dropped when the test ends.
func articleOnlyDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbtest.NewEmptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), migrations.ArticleSchema+`CREATE TABLE staged_jobs (id BIGSERIAL PRIMARY KEY, job_name TEXT NOT NULL, job_args JSONB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

package reaper

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testSettings are fast defaults for tests: no pause between batches.
func testSettings() Settings {
	s := DefaultSettings()
	s.BatchPause = 0
	// A short lease: a run that finds another waits for a renewal (a
	// quarter of the TTL) or an expiry.
	s.StatementTimeout, s.LeaseTTL = 5*time.Second, 8*time.Second
	// No load limits: the shared test server's WAL and checkpoints are
	// every test's, and the tests of the load limits set them.
	s.Throttle.MaxLoad = ""
	return s
}

// newService builds a Service on pool; mutate adjusts the settings.
func newService(t *testing.T, pool *pgxpool.Pool, mutate func(*Settings)) *Service {
	t.Helper()
	s := testSettings()
	if mutate != nil {
		mutate(&s)
	}
	svc, err := New(Config{Settings: s, Pool: pool, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return svc
}

// dryRunText is what the command prints for a dry run's result.
func dryRunText(t *testing.T, svc *Service, res *Result) string {
	t.Helper()
	if res.Plan == nil {
		t.Fatalf("no plan in the dry run's result %+v", res)
	}
	var out bytes.Buffer
	if err := writeDryRun(&out, &svc.cfg.Settings, res.Plan); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// dbNow is the database clock.
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

type keySpec struct {
	name        string
	createdAt   time.Time
	point       string // default "finished"
	lockedAt    *time.Time
	leasedUntil *time.Time
	gaveUpAt    *time.Time
}

func insertKey(t *testing.T, pool *pgxpool.Pool, k keySpec) int64 {
	t.Helper()
	if k.point == "" {
		k.point = "finished"
	}
	var id int64
	err := pool.QueryRow(context.Background(), `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, recovery_point, user_id, completer_leased_until, completer_gave_up_at)
VALUES ($1, $2, $1, $3, 'POST', jsonb_build_object('name', $2::text), '/rides', $4, 42, $5, $6)
RETURNING id`, k.createdAt, k.name, k.lockedAt, k.point, k.leasedUntil, k.gaveUpAt).Scan(&id)
	if err != nil {
		t.Fatalf("insert key %s: %v", k.name, err)
	}
	return id
}

// insertOldKeys inserts n keys created 100 h ago and later, one second apart
// (so their order is known), every third one unfinished. It returns their
// ids oldest first.
func insertOldKeys(t *testing.T, pool *pgxpool.Pool, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
INSERT INTO idempotency_keys (created_at, idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
SELECT now() - interval '100 hours' + g * interval '1 second', 'bulk-' || g, NULL, 'POST', '{"amount": 100}', '/rides',
       CASE WHEN g % 3 = 0 THEN 'started' ELSE 'finished' END, 7
FROM generate_series(1, $1::int) g
ORDER BY g
RETURNING id`, n)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func keyExists(t *testing.T, pool *pgxpool.Pool, id int64) bool {
	return queryInt(t, pool, "SELECT count(*) FROM idempotency_keys WHERE id = $1", id) == 1
}

// reviewReasons returns the reasons of id's reviews.
func reviewReasons(t *testing.T, pool *pgxpool.Pool, id int64) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT reason FROM idempotency_key_reviews WHERE key_id = $1 ORDER BY id", id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// tableDigest fingerprints both tables the reaper writes.
func tableDigest(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var a, b string
	err := pool.QueryRow(context.Background(), `
SELECT (SELECT coalesce(md5(string_agg(to_jsonb(k)::text, ',' ORDER BY id)), '') FROM idempotency_keys k),
       (SELECT coalesce(md5(string_agg(to_jsonb(r)::text, ',' ORDER BY id)), '') FROM idempotency_key_reviews r)`).Scan(&a, &b)
	if err != nil {
		t.Fatal(err)
	}
	return a + "/" + b
}

// createRides creates the article's rides table, referencing keys with the
// given ON DELETE action, with one ride per key id in refs. It is the API's
// table, owned by another role than the reaper's, as in production (a
// foreign key's ON DELETE action runs as the referencing table's owner).
// The tests' runtime pool also plays the API that writes and locks rides,
// hence the grant, without DELETE.
func createRides(t *testing.T, pool *pgxpool.Pool, onDelete string, refs ...int64) {
	t.Helper()
	ctx := context.Background()
	pool = dbtest.AdminPool(t, pool)
	_, err := pool.Exec(ctx, `
CREATE TABLE rides (
    id                 BIGSERIAL PRIMARY KEY,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key_id BIGINT CONSTRAINT rides_idempotency_key_id_fkey
                       REFERENCES idempotency_keys ON DELETE `+onDelete+`,
    origin_lat NUMERIC(13,10) NOT NULL DEFAULT 0,
    origin_lon NUMERIC(13,10) NOT NULL DEFAULT 0,
    stripe_charge_id TEXT,
    user_id BIGINT NOT NULL DEFAULT 42
);
CREATE UNIQUE INDEX rides_idempotency_key_id ON rides (idempotency_key_id) WHERE idempotency_key_id IS NOT NULL;
GRANT SELECT, INSERT, UPDATE ON rides TO `+dbtest.RuntimeRole+`;
GRANT USAGE ON SEQUENCE rides_id_seq TO `+dbtest.RuntimeRole+`;`)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range refs {
		if _, err := pool.Exec(ctx, "INSERT INTO rides (idempotency_key_id) VALUES ($1)", id); err != nil {
			t.Fatal(err)
		}
	}
}

// Package completerbench measures the completer: its candidate query on a
// large table with a small unfinished fraction, against the article's query
// on the article's indexes (in one run, on one table), end-to-end replays
// against the Rocket Rides reference API, and (hot.go) what idemd's schema
// costs the API's own key updates.
package completerbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Options size the benchmark. Zero values take the defaults (the issue's
// sizes).
type Options struct {
	Keys               int     // rows in idempotency_keys (2,000,000)
	UnfinishedFraction float64 // of Keys (0.001)
	QueryRuns          int     // timed runs of each query (25)
	BatchSize          int     // LIMIT of the candidate query (100)
	DrainKeys          int     // abandoned keys drained end to end (10,000)
	Concurrency        int     // completer concurrency for the drain (8)
	Logf               func(format string, args ...any)
	Keep               bool // keep the database (for inspection)
}

func (o *Options) defaults() {
	if o.Keys <= 0 {
		o.Keys = 2_000_000
	}
	if o.UnfinishedFraction <= 0 {
		o.UnfinishedFraction = 0.001
	}
	if o.QueryRuns <= 0 {
		o.QueryRuns = 25
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 100
	}
	if o.DrainKeys <= 0 {
		o.DrainKeys = 10_000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// QueryTiming is one query's measurement (client-side, one round trip).
type QueryTiming struct {
	Median, P95, Min time.Duration
	Rows             int
	Plan             string // the plan's top lines
}

// Report is the benchmark's result.
type Report struct {
	Keys, Unfinished, BatchSize int
	// Article: the same predicates and ORDER BY created_at LIMIT, on the
	// article's schema (no created_at index, no idemd_unfinished_keys).
	Article QueryTiming
	// Ours: the completer's candidate query (idemd_unfinished_keys).
	Ours QueryTiming
	// CreatedAtScan: the alternative that indexes only a column the API
	// never updates: the same predicates checked on the heap while walking
	// idempotency_keys_created_at from the oldest key (no side table).
	CreatedAtScan QueryTiming
	Speedup       float64 // Article.Median / Ours.Median
	// Both are timed as selections (without FOR UPDATE SKIP LOCKED, which
	// also rules out parallel plans). The Locking variants add the row
	// locks a claim takes: one heap write and WAL record per row.
	ArticleLocking, OursLocking QueryTiming

	DrainKeys        int
	Drain            time.Duration // time to drain DrainKeys abandoned keys
	Replays          int           // replay requests sent during the drain
	ReplaysPerSecond float64
	Concurrency      int
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "completer candidate query, %d keys, %d unfinished (LIMIT %d):\n", r.Keys, r.Unfinished, r.BatchSize)
	fmt.Fprintf(&b, "  article (its own indexes):          median %s  p95 %s  min %s  [%s]\n", r.Article.Median, r.Article.P95, r.Article.Min, r.Article.Plan)
	fmt.Fprintf(&b, "  idemd   (idemd_unfinished_keys):    median %s  p95 %s  min %s  [%s]\n", r.Ours.Median, r.Ours.P95, r.Ours.Min, r.Ours.Plan)
	fmt.Fprintf(&b, "  alternative (created_at index only): median %s  p95 %s  min %s  [%s]\n", r.CreatedAtScan.Median, r.CreatedAtScan.P95, r.CreatedAtScan.Min, r.CreatedAtScan.Plan)
	fmt.Fprintf(&b, "  speedup %.0fx (target >= 100x, ours <= 1ms)\n", r.Speedup)
	fmt.Fprintf(&b, "  with FOR UPDATE SKIP LOCKED (row locks of a claim): article median %s, idemd median %s\n", r.ArticleLocking.Median, r.OursLocking.Median)
	fmt.Fprintf(&b, "completer end to end against Rocket Rides: drained %d abandoned keys in %s, %d replays, %.0f replays/s (concurrency %d)\n",
		r.DrainKeys, r.Drain.Round(time.Millisecond), r.Replays, r.ReplaysPerSecond, r.Concurrency)
	return b.String()
}

// Run creates its own database on the server at adminURL, measures, and
// drops the database (unless opts.Keep).
func Run(ctx context.Context, adminURL string, opts Options) (*Report, error) {
	opts.defaults()
	dbURL, drop, err := scratchdb.Create(ctx, adminURL, "idemd_completerbench")
	if err != nil {
		return nil, fmt.Errorf("completerbench: %w", err)
	}
	if !opts.Keep {
		defer drop(context.WithoutCancel(ctx)) //nolint:errcheck
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(opts.Concurrency*2 + 8)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		return nil, err
	}
	if err := api.Migrate(ctx, pool); err != nil {
		return nil, err
	}

	rep := &Report{Keys: opts.Keys, BatchSize: opts.BatchSize, Concurrency: opts.Concurrency}
	if err := fillKeys(ctx, pool, opts, rep); err != nil {
		return nil, err
	}
	if err := measureQueries(ctx, pool, opts, rep); err != nil {
		return nil, err
	}
	if err := drain(ctx, pool, opts, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func fillKeys(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	every := int(1 / opts.UnfinishedFraction)
	const chunk = 250_000
	start := time.Now()
	for lo := 1; lo <= opts.Keys; lo += chunk {
		hi := min(lo+chunk-1, opts.Keys)
		// Created over the last 72 h (the retention window); one key in
		// `every` abandoned at a random recovery point.
		_, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, response_code, response_body, recovery_point, user_id)
SELECT t, 'bench-' || g, t, NULL, 'POST', '{"origin_lat":0,"origin_lon":0,"target_lat":37.7749,"target_lon":-122.4194}',
       '/rides',
       CASE WHEN g % $3 = 0 THEN NULL ELSE 201 END,
       CASE WHEN g % $3 = 0 THEN NULL ELSE '{"message":"ok"}' END,
       CASE WHEN g % $3 = 0 THEN (ARRAY['started','ride_created','charge_created'])[1 + g % 3] ELSE 'finished' END,
       1 + g % 1000
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT now() - interval '72 hours' * random() - interval '10 minutes' AS t) x`, lo, hi, every)
		if err != nil {
			return fmt.Errorf("completerbench: fill: %w", err)
		}
		opts.Logf("completerbench: %d/%d keys (%s)", hi, opts.Keys, time.Since(start).Round(time.Second))
	}
	// Vacuum (visibility map, statistics) and checkpoint so the timed
	// queries do not share the disk with the fill's write-back.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idempotency_keys`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		opts.Logf("completerbench: checkpoint: %v (needs superuser; timings may be noisier)", err)
	}
	return pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`).Scan(&rep.Unfinished)
}

// The three candidate selections the benchmark compares. They share the
// completer's named parameters: @batch_size, @grace, @idle, @lock_timeout.

// candidateSQL reads the completer's candidate query and its row locking
// as the completer composes them: internal/completer's testdata/
// candidate.sql and candidate_locking.sql, which its
// TestComposedSQLIsReviewable keeps equal to the statements it runs. The
// benchmark times the very text, with no copy of its own to drift, and the
// completer exports nothing for it. The files are found beside this
// source file, as `make bench` (go run) and go test build it.
func candidateSQL() (selection, locking string, err error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", "", errors.New("completerbench: cannot locate the source tree")
	}
	dir := filepath.Join(filepath.Dir(self), "..", "..", "completer", "testdata")
	if !filepath.IsAbs(self) {
		// Built with -trimpath: the source path is the module's, and
		// `make bench` runs from the repository's root.
		dir = filepath.Join("internal", "completer", "testdata")
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("completerbench: the completer's composed statement: %w", err)
		}
		return "\n" + string(b), nil
	}
	if selection, err = read("candidate.sql"); err != nil {
		return "", "", err
	}
	if locking, err = read("candidate_locking.sql"); err != nil {
		return "", "", err
	}
	return selection, locking, nil
}

// articleSQL is the article's candidate selection: the same predicates (it
// has no completer bookkeeping columns) and order.
const articleSQL = `
    SELECT c.id FROM idempotency_keys c
    WHERE c.recovery_point <> 'finished'
      AND c.created_at < now() - @grace::interval
      AND c.last_run_at < now() - @idle::interval
      AND (c.locked_at IS NULL OR c.locked_at < now() - @lock_timeout::interval)
    ORDER BY c.created_at
    LIMIT @batch_size`

// articleLocking is the article's row locking.
const articleLocking = `
    FOR UPDATE SKIP LOCKED`

// createdAtScanSQL is the candidate selection without idemd_unfinished_keys:
// an ordered walk of the created_at index, every predicate on the heap.
const createdAtScanSQL = `
    SELECT c.id FROM idempotency_keys c
    WHERE c.recovery_point <> 'finished'
      AND c.completer_gave_up_at IS NULL
      AND c.created_at < now() - @grace::interval
      AND c.last_run_at < now() - @idle::interval
      AND (c.locked_at IS NULL OR c.locked_at < now() - @lock_timeout::interval)
      AND (c.completer_next_attempt_at IS NULL OR c.completer_next_attempt_at <= now())
      AND (c.completer_leased_until IS NULL OR c.completer_leased_until < now())
    ORDER BY c.created_at
    LIMIT @batch_size`

func measureQueries(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	def := completer.DefaultSettings()
	args := pgx.NamedArgs{"batch_size": opts.BatchSize, "grace": def.Grace, "idle": def.Idle, "lock_timeout": def.LockTimeout}
	var err error
	// The article's query on the article's indexes: drop idemd's
	// created_at index in a transaction that is rolled back, so both
	// queries run on one table (the article's query does not read
	// idemd_unfinished_keys).
	const dropIdemdIndexes = `DROP INDEX idempotency_keys_created_at`
	if rep.Article, err = timeQuery(ctx, pool, opts, articleSQL, args, dropIdemdIndexes); err != nil {
		return fmt.Errorf("completerbench: article query: %w", err)
	}
	ours, locking, err := candidateSQL()
	if err != nil {
		return err
	}
	if rep.Ours, err = timeQuery(ctx, pool, opts, ours, args, ""); err != nil {
		return fmt.Errorf("completerbench: candidate query: %w", err)
	}
	if rep.CreatedAtScan, err = timeQuery(ctx, pool, opts, createdAtScanSQL, args, ""); err != nil {
		return fmt.Errorf("completerbench: created_at scan: %w", err)
	}
	if rep.ArticleLocking, err = timeQuery(ctx, pool, opts, articleSQL+articleLocking, args, dropIdemdIndexes); err != nil {
		return fmt.Errorf("completerbench: article query: %w", err)
	}
	if rep.OursLocking, err = timeQuery(ctx, pool, opts, ours+locking, args, ""); err != nil {
		return fmt.Errorf("completerbench: candidate query: %w", err)
	}
	if rep.Ours.Median > 0 {
		rep.Speedup = float64(rep.Article.Median) / float64(rep.Ours.Median)
	}
	opts.Logf("completerbench: article median %s, ours median %s", rep.Article.Median, rep.Ours.Median)
	return nil
}

func timeQuery(ctx context.Context, pool *pgxpool.Pool, opts Options, sql string, args pgx.NamedArgs, setup string) (QueryTiming, error) {
	var qt QueryTiming
	tx, err := pool.Begin(ctx)
	if err != nil {
		return qt, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if setup != "" {
		if _, err := tx.Exec(ctx, setup); err != nil {
			return qt, err
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args)
	if err != nil {
		return qt, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return qt, err
	}
	var plan []string
	for _, l := range lines {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "->"))
		if i := strings.Index(l, "  (cost"); i > 0 {
			l = l[:i]
		}
		if strings.Contains(l, "Scan") || strings.Contains(l, "Gather") || strings.Contains(l, "Sort") {
			plan = append(plan, strings.TrimSpace(l))
		}
	}
	qt.Plan = strings.Join(plan, " > ")
	// One warm-up run, then the timed ones, each in a savepoint so the
	// row locks of one run do not change the next.
	var ds []time.Duration
	for i := 0; i <= opts.QueryRuns; i++ {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return qt, err
		}
		start := time.Now()
		rows, err := sp.Query(ctx, sql, args)
		if err != nil {
			return qt, err
		}
		n := 0
		for rows.Next() {
			n++
		}
		d := time.Since(start)
		if err := rows.Err(); err != nil {
			return qt, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return qt, err
		}
		qt.Rows = n
		if i > 0 {
			ds = append(ds, d)
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	qt.Min = ds[0]
	qt.Median = ds[len(ds)/2]
	qt.P95 = ds[min(len(ds)-1, len(ds)*95/100)]
	return qt, nil
}

// drain abandons DrainKeys ride requests at "started" (rows written as the
// API writes them before its first phase) and times one completer draining
// them through the real Rocket Rides API and its fake Stripe.
func drain(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	if _, err := pool.Exec(ctx, `TRUNCATE idempotency_keys, idemd_unfinished_keys CASCADE`); err != nil {
		return err
	}
	const users = 200
	for i := range users {
		if _, err := api.CreateUser(ctx, pool, fmt.Sprintf("bench-%d@example.com", i), fmt.Sprintf("cus_bench_%d", i), "sk_bench_"+randHex(8)); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, recovery_point, user_id)
SELECT now() - interval '1 hour', 'bench-drain-' || g, now() - interval '1 hour', NULL, 'POST',
       '{"origin_lat":0,"origin_lon":0,"target_lat":37.7749,"target_lon":-122.4194}', '/rides', 'started', u.id
FROM generate_series(1, $1) g
JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM users) u ON u.n = g % $2`, opts.DrainKeys, users); err != nil {
		return fmt.Errorf("completerbench: abandon: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idempotency_keys`); err != nil {
		return err
	}

	secret, err := replayauth.NewSecret([]byte("completerbench-secret-0123456789abcdef"))
	if err != nil {
		return err
	}
	verifier, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		return err
	}
	signer, err := replayauth.NewSigner(secret)
	if err != nil {
		return err
	}
	stripeSrv := httptest.NewServer(fakestripe.New())
	defer stripeSrv.Close()
	stripeHTTP := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer stripeHTTP.CloseIdleConnections()
	h, err := api.New(api.Config{Pool: pool, StripeURL: stripeSrv.URL, StripeKey: "sk_test_bench", Replay: verifier, StripeHTTPClient: stripeHTTP})
	if err != nil {
		return err
	}
	var replays atomicCounter
	apiSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		replays.inc()
		h.ServeHTTP(w, r)
	}))
	defer apiSrv.Close()

	cfg := completer.Config{Settings: completer.DefaultSettings(), Pool: pool, Signer: signer, Logger: zap.NewNop()}
	cfg.APIURL = apiSrv.URL
	cfg.Grace, cfg.Idle = 0, 0
	cfg.Concurrency = opts.Concurrency
	cfg.Rate, cfg.Burst = 1e6, 1000
	cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 100*time.Millisecond
	cfg.InProgressDelay = 50 * time.Millisecond
	svc, err := completer.New(cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	for {
		if _, err := svc.RunOnce(ctx); err != nil {
			return err
		}
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			break
		}
		if time.Since(start) > 30*time.Minute {
			return fmt.Errorf("completerbench: %d keys left after 30 minutes", left)
		}
		// Some keys are backing off (a serialization conflict answered 409
		// or 5xx); the next pass picks them up when due.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	rep.Drain = time.Since(start)
	rep.DrainKeys = opts.DrainKeys
	rep.Replays = replays.get()
	rep.ReplaysPerSecond = float64(rep.Replays) / rep.Drain.Seconds()
	var finished int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE response_code = 201`).Scan(&finished); err != nil {
		return err
	}
	if finished != opts.DrainKeys {
		return fmt.Errorf("completerbench: %d of %d keys finished with 201", finished, opts.DrainKeys)
	}
	opts.Logf("completerbench: drained %d keys in %s", opts.DrainKeys, rep.Drain)
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

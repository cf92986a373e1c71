package completerbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/migrations"
)

// The key workload: what idemd's schema costs the API's own key updates.
// Several clients run the article's request, each with keys of its own, in
// SERIALIZABLE transactions as the article's atomic phases do:
//
//	begin:  look the key up by (user_id, idempotency_key), insert it locked
//	phases: check the lock, set recovery_point, locked_at, last_run_at
//	        (twice: ride_created, charge_created)
//	finish: check the lock, set finished, unlock, store response_code/body
//
// A transaction that fails with a serialization failure (40001) or a
// deadlock (40P01) is counted and retried, as the article's API does. The
// same workload runs on one database per schema variant, in interleaved
// rounds, and the report compares the share of idempotency_keys updates
// PostgreSQL did as HOT updates (pg_stat_user_tables) and the failure rate.

// HotVariant is one schema the key workload runs on: the article's schema,
// then Setup.
type HotVariant struct {
	Name  string
	Setup func(ctx context.Context, pool *pgxpool.Pool) error
}

// ArticleVariant is the article's schema alone.
var ArticleVariant = HotVariant{Name: "article"}

// IdemdVariant is the article's schema after idemd's migrations.
var IdemdVariant = HotVariant{Name: "idemd", Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := migrate.Up(ctx, pool, migrate.Options{})
	return err
}}

// HotOptions size the key workload. Zero values take the defaults.
type HotOptions struct {
	Clients  int           // concurrent clients (4)
	Duration time.Duration // per variant per round (8s)
	Rounds   int           // interleaved rounds (4)
	Prefill  int           // finished keys in the table before the run (200,000)
	// Users the keys are spread over (20). Few users put many of the
	// concurrent requests' keys on the same pages of the (user_id,
	// idempotency_key) index, so serialization failures are frequent
	// enough (hundreds per run) for their rate to be compared.
	Users int
	// Variants to compare; default ArticleVariant then IdemdVariant. The
	// first is the anchor.
	Variants []HotVariant
	Logf     func(format string, args ...any)
}

func (o *HotOptions) defaults() {
	if o.Clients <= 0 {
		o.Clients = 4
	}
	if o.Duration <= 0 {
		o.Duration = 8 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 4
	}
	if o.Prefill <= 0 {
		o.Prefill = 200_000
	}
	if o.Users <= 0 {
		o.Users = 20
	}
	if len(o.Variants) == 0 {
		o.Variants = []HotVariant{ArticleVariant, IdemdVariant}
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// HotResult is the key workload on one schema variant, summed over rounds.
type HotResult struct {
	Name       string
	Requests   int64 // requests completed (key finished)
	Commits    int64 // transactions committed
	Failures   int64 // serialization failures and deadlocks (each retried)
	Updates    int64 // idempotency_keys n_tup_upd during the runs
	HotUpdates int64 // of which HOT (n_tup_hot_upd)
	Elapsed    time.Duration
}

// HotShare is the share of key updates done as HOT updates.
func (r HotResult) HotShare() float64 {
	if r.Updates == 0 {
		return 0
	}
	return float64(r.HotUpdates) / float64(r.Updates)
}

// FailureRate is serialization failures per transaction attempt.
func (r HotResult) FailureRate() float64 {
	if r.Commits+r.Failures == 0 {
		return 0
	}
	return float64(r.Failures) / float64(r.Commits+r.Failures)
}

// RequestsPerSecond is completed requests per second of workload.
func (r HotResult) RequestsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// HotReport is the key workload on every variant.
type HotReport struct {
	Clients int
	Prefill int
	Rounds  int
	Results []HotResult // in HotOptions.Variants order; [0] is the anchor
}

// Anchor is the first variant's result (the article's schema).
func (r *HotReport) Anchor() HotResult { return r.Results[0] }

// Get returns the named variant's result.
func (r *HotReport) Get(name string) (HotResult, bool) {
	for _, x := range r.Results {
		if x.Name == name {
			return x, true
		}
	}
	return HotResult{}, false
}

func (r *HotReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "key workload, %d clients, %d rounds, %d finished keys prefilled:\n", r.Clients, r.Rounds, r.Prefill)
	a := r.Anchor()
	for _, x := range r.Results {
		fmt.Fprintf(&b, "  %-28s %6.0f req/s  HOT %5.1f%% (%d/%d, %.2f× anchor)  failures %d of %d attempts = %.2f%% (%.2f× anchor)\n",
			x.Name, x.RequestsPerSecond(), 100*x.HotShare(), x.HotUpdates, x.Updates, ratio(x.HotShare(), a.HotShare()),
			x.Failures, x.Commits+x.Failures, 100*x.FailureRate(), ratio(x.FailureRate(), a.FailureRate()))
	}
	return b.String()
}

func ratio(x, anchor float64) float64 {
	if anchor == 0 {
		if x == 0 {
			return 1
		}
		return 0
	}
	return x / anchor
}

// RunHot runs the key workload on every variant, each in a database of its
// own on the server at adminURL (dropped afterwards).
func RunHot(ctx context.Context, adminURL string, opts HotOptions) (*HotReport, error) {
	opts.defaults()
	pools := make([]*pgxpool.Pool, len(opts.Variants))
	for i, v := range opts.Variants {
		dbURL, drop, err := scratchdb.Create(ctx, adminURL, "idemd_hotbench")
		if err != nil {
			return nil, fmt.Errorf("completerbench: %w", err)
		}
		defer drop(context.WithoutCancel(ctx)) //nolint:errcheck
		pcfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return nil, err
		}
		pcfg.MaxConns = int32(opts.Clients + 4)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		pools[i] = pool
		if err := prepareHot(ctx, pool, v, opts); err != nil {
			return nil, fmt.Errorf("completerbench: %s: %w", v.Name, err)
		}
	}
	rep := &HotReport{Clients: opts.Clients, Prefill: opts.Prefill, Rounds: opts.Rounds, Results: make([]HotResult, len(opts.Variants))}
	for i, v := range opts.Variants {
		rep.Results[i].Name = v.Name
	}
	for round := range opts.Rounds {
		for i, v := range opts.Variants {
			// Alternate the order so neither variant always runs first.
			if round%2 == 1 {
				i = len(opts.Variants) - 1 - i
				v = opts.Variants[i]
			}
			res, err := runHotRound(ctx, pools[i], opts, round)
			if err != nil {
				return nil, fmt.Errorf("completerbench: %s: %w", v.Name, err)
			}
			r := &rep.Results[i]
			r.Requests += res.Requests
			r.Commits += res.Commits
			r.Failures += res.Failures
			r.Updates += res.Updates
			r.HotUpdates += res.HotUpdates
			r.Elapsed += res.Elapsed
			opts.Logf("completerbench: key workload round %d, %s: %d requests, HOT %d/%d, failures %d",
				round+1, v.Name, res.Requests, res.HotUpdates, res.Updates, res.Failures)
		}
	}
	return rep, nil
}

func prepareHot(ctx context.Context, pool *pgxpool.Pool, v HotVariant, opts HotOptions) error {
	if _, err := pool.Exec(ctx, migrations.ArticleSchema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO users (email) SELECT 'u' || g || '@example.com' FROM generate_series(1, $1) g`, opts.Users); err != nil {
		return err
	}
	// Finished keys, as the API leaves them, so the table and its indexes
	// are not toy-sized.
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
                              request_path, response_code, response_body, recovery_point, user_id)
SELECT t, 'prefill-' || g, t, NULL, 'POST', '{"origin_lat":0,"origin_lon":0,"target_lat":37.7749,"target_lon":-122.4194}',
       '/rides', 201, '{"message":"ok"}', 'finished', 1 + g % $2
FROM generate_series(1, $1) g,
     LATERAL (SELECT now() - interval '72 hours' * random() AS t) x`, opts.Prefill, opts.Users); err != nil {
		return err
	}
	if v.Setup != nil {
		if err := v.Setup(ctx, pool); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE idempotency_keys`)
	return err
}

type hotRound struct {
	Requests, Commits, Failures int64
	Updates, HotUpdates         int64
	Elapsed                     time.Duration
}

func keyUpdateStats(ctx context.Context, pool *pgxpool.Pool) (upd, hot int64, err error) {
	err = pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'idempotency_keys'::regclass`).Scan(&upd, &hot)
	return upd, hot, err
}

func runHotRound(ctx context.Context, pool *pgxpool.Pool, opts HotOptions, round int) (hotRound, error) {
	var res hotRound
	conns := make([]*pgxpool.Conn, opts.Clients)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return res, err
		}
		defer c.Release()
		conns[i] = c
	}
	upd0, hot0, err := keyUpdateStats(ctx, pool)
	if err != nil {
		return res, err
	}
	var requests, commits, failures atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, opts.Clients)
	start := time.Now()
	deadline := start.Add(opts.Duration)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := hotClient{conn: c.Conn(), rng: rand.New(rand.NewPCG(uint64(round), uint64(i))), users: opts.Users,
				commits: &commits, failures: &failures}
			for n := 0; time.Now().Before(deadline); n++ {
				if err := cl.request(ctx, fmt.Sprintf("hot-%d-%d-%d-%016x", round, i, n, cl.rng.Uint64())); err != nil {
					errs[i] = err
					return
				}
				requests.Add(1)
			}
			// Flush this backend's statistics now, not up to a second later.
			if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				errs[i] = err
				return
			}
			if _, err := c.Exec(ctx, `SELECT 1`); err != nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	upd1, hot1, err := keyUpdateStats(ctx, pool)
	if err != nil {
		return res, err
	}
	res.Requests, res.Commits, res.Failures = requests.Load(), commits.Load(), failures.Load()
	res.Updates, res.HotUpdates = upd1-upd0, hot1-hot0
	return res, nil
}

type hotClient struct {
	conn              *pgx.Conn
	rng               *rand.Rand
	users             int
	commits, failures *atomic.Int64
}

// request runs one request through its four transactions.
func (c *hotClient) request(ctx context.Context, key string) error {
	user := 1 + c.rng.IntN(c.users)
	var id int64
	var locked time.Time
	err := c.serializable(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id, locked_at FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`, user, key).Scan(&id, &locked)
		if !errors.Is(err, pgx.ErrNoRows) {
			if err == nil {
				err = fmt.Errorf("key %s exists", key)
			}
			return err
		}
		return tx.QueryRow(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at, request_method, request_params, request_path, recovery_point)
VALUES ($1, $2, now(), now(), 'POST', '{"origin_lat":0,"origin_lon":0,"target_lat":37.7749,"target_lon":-122.4194}', '/rides', 'started')
RETURNING id, locked_at`, key, user).Scan(&id, &locked)
	})
	if err != nil {
		return err
	}
	for _, point := range []string{"ride_created", "charge_created"} {
		var next time.Time // the new lock, once committed
		if err := c.serializable(ctx, func(tx pgx.Tx) error {
			if err := c.checkLock(ctx, tx, id, locked); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `
UPDATE idempotency_keys SET recovery_point = $2, locked_at = now(), last_run_at = now()
WHERE id = $1 RETURNING locked_at`, id, point).Scan(&next)
		}); err != nil {
			return err
		}
		locked = next
	}
	return c.serializable(ctx, func(tx pgx.Tx) error {
		if err := c.checkLock(ctx, tx, id, locked); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
UPDATE idempotency_keys
SET recovery_point = 'finished', locked_at = NULL, last_run_at = now(), response_code = 201, response_body = '{"id": 1}'
WHERE id = $1`, id)
		return err
	})
}

func (c *hotClient) checkLock(ctx context.Context, tx pgx.Tx, id int64, locked time.Time) error {
	var held bool
	if err := tx.QueryRow(ctx, `SELECT locked_at = $2 FROM idempotency_keys WHERE id = $1`, id, locked).Scan(&held); err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("key %d: lock lost", id)
	}
	return nil
}

// serializable runs fn in a SERIALIZABLE transaction, retrying it after a
// serialization failure or deadlock.
func (c *hotClient) serializable(ctx context.Context, fn func(pgx.Tx) error) error {
	for {
		err := pgx.BeginTxFunc(ctx, c.conn, pgx.TxOptions{IsoLevel: pgx.Serializable}, fn)
		if err == nil {
			c.commits.Add(1)
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
			c.failures.Add(1)
			continue
		}
		return err
	}
}

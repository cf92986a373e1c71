// Package enqueuerbench measures the enqueuer against its anchors in one run,
// on one database, so ratios are comparable on a noisy machine:
//
//   - the physical limit: one SQL statement moving every staged row into
//     river_job server-side (no round trips, no validation);
//   - the article's algorithm: select a batch, insert each job one by one,
//     delete up to the last id;
//   - the enqueuer with its defaults, other batch sizes, and two replicas;
//   - commit-to-River latency at a steady staging rate, woken by NOTIFY,
//     against the article's 5 s polling;
//   - with Options.Pooler, the enqueuer behind a real PgBouncer in
//     transaction mode (its pool through pgbouncer with
//     QueryExecModeCacheDescribe, as --pooler transaction sets it): the drain
//     right after the direct one, and latency with the listener on a direct
//     connection (Settings.ListenDatabaseURL, the recommended setup) and poll-only
//     (no direct URL), right after the direct latency run;
//   - RunSnapshot (snapshot.go): a steady 1,000 jobs/s for minutes with and
//     without a REPEATABLE READ snapshot held open the whole time (issue 16),
//     per minute.
package enqueuerbench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/pgbouncer"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Options size the run. Zero values take the defaults.
type Options struct {
	Jobs            int           // backlog drained by each throughput variant (default 200,000)
	LatencyRate     int           // staged jobs per second for the latency runs (default 1,000)
	LatencyDuration time.Duration // length of each latency run (default 10s)
	SkipArticle     bool          // the article's algorithm is slow; skip it for quick runs
	SkipPolling     bool          // skip the 5 s polling latency run
	// Pooler adds the variants through a PgBouncer in transaction mode
	// (internal/testing/pgbouncer starts it; Run fails without the binary).
	Pooler bool
	// PoolerPoolSize is pgbouncer's default_pool_size (default 10: the
	// enqueuer's 2 workers, its first batch and stats queries, plus
	// headroom).
	PoolerPoolSize int
	Logf           func(format string, args ...any)
}

// Throughput is one drain of the backlog.
type Throughput struct {
	Name       string
	Jobs       int
	Duration   time.Duration
	JobsPerSec float64
	VsSingle   float64 // ratio to the single-statement anchor
	VsArticle  float64 // ratio to the article's algorithm (0 when skipped)
}

// Latency is commit-to-River latency at a steady staging rate.
type Latency struct {
	Name          string
	Jobs          int
	P50, P99, Max time.Duration
}

// Report is the outcome of Run.
type Report struct {
	Throughput []Throughput
	Latency    []Latency
}

// Run creates its own database on the server of adminURL and measures.
func Run(ctx context.Context, adminURL string, opts Options) (*Report, error) {
	opts.Jobs = cmp.Or(opts.Jobs, 200_000)
	opts.LatencyRate = cmp.Or(opts.LatencyRate, 1000)
	opts.LatencyDuration = cmp.Or(opts.LatencyDuration, 10*time.Second)
	opts.PoolerPoolSize = cmp.Or(opts.PoolerPoolSize, 10)
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}

	pool, drop, err := newDatabase(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	defer drop()
	defer pool.Close()

	b := &bench{pool: pool, jobs: opts.Jobs, logf: logf}
	rep := &Report{}

	// Only the enqueuer's pool goes through pgbouncer; staging, TRUNCATE,
	// VACUUM and the checks stay on the direct pool.
	var pooled *pgxpool.Config
	if opts.Pooler {
		proc, stop, err := pgbouncer.Run(ctx, pgbouncer.Options{Mode: "transaction", PoolSize: opts.PoolerPoolSize, BackendURL: adminURL, Logf: logf})
		if err != nil {
			return nil, fmt.Errorf("enqueuerbench: %w", err)
		}
		defer func() {
			if err := stop(); err != nil {
				logf("enqueuerbench: %v", err)
			}
		}()
		direct := pool.Config()
		pooled, err = pgxpool.ParseConfig(proc.URL(direct.ConnConfig.Database, direct.ConnConfig.User))
		if err != nil {
			return nil, err
		}
		pooled.MaxConns = direct.MaxConns
		// What daemon.NewPool does for --pooler transaction: unnamed
		// statements with cached descriptions, nothing prepared on a
		// server connection.
		pooled.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	poolerName := fmt.Sprintf("through PgBouncer (transaction mode, pool %d)", opts.PoolerPoolSize)

	type variant struct {
		name string
		run  func(context.Context) error
	}
	variants := []variant{
		{"single SQL statement (anchor)", b.singleStatement},
	}
	if !opts.SkipArticle {
		variants = append(variants, variant{"article: one-by-one inserts (anchor)", b.article})
	}
	variants = append(variants,
		variant{"enqueuer, defaults (batch 5000, 2 workers)", b.enqueuer(1, nil)},
	)
	if pooled != nil {
		variants = append(variants, variant{"enqueuer, defaults, " + poolerName, b.enqueuerOn(pooled, nil)})
	}
	variants = append(variants,
		variant{"enqueuer, 1 worker", b.enqueuer(1, func(s *enqueuer.Settings) { s.Workers = 1 })},
		variant{"enqueuer, batch 2000", b.enqueuer(1, func(s *enqueuer.Settings) { s.BatchSize = 2000 })},
		variant{"enqueuer, 2 replicas, defaults", b.enqueuer(2, nil)},
	)
	for _, v := range variants {
		if err := b.stage(ctx); err != nil {
			return nil, err
		}
		start := time.Now()
		if err := v.run(ctx); err != nil {
			return nil, fmt.Errorf("enqueuerbench %s: %w", v.name, err)
		}
		d := time.Since(start)
		if err := b.verify(ctx); err != nil {
			return nil, fmt.Errorf("enqueuerbench %s: %w", v.name, err)
		}
		t := Throughput{Name: v.name, Jobs: opts.Jobs, Duration: d, JobsPerSec: float64(opts.Jobs) / d.Seconds()}
		logf("%-40s %8.0f jobs/s (%s)", v.name, t.JobsPerSec, d.Round(time.Millisecond))
		rep.Throughput = append(rep.Throughput, t)
	}
	single := rep.Throughput[0].JobsPerSec
	article := 0.0
	if !opts.SkipArticle {
		article = rep.Throughput[1].JobsPerSec
	}
	for i := range rep.Throughput {
		rep.Throughput[i].VsSingle = rep.Throughput[i].JobsPerSec / single
		if article > 0 {
			rep.Throughput[i].VsArticle = rep.Throughput[i].JobsPerSec / article
		}
	}

	type latVariant struct {
		name    string
		change  func(*enqueuer.Settings)
		svcPool *pgxpool.Config
	}
	lvs := []latVariant{{"enqueuer, NOTIFY (defaults)", nil, pool.Config()}}
	if pooled != nil {
		lvs = append(lvs,
			// The recommended setup: the pool through the pooler, LISTEN on
			// a direct connection (--listen-database-url).
			latVariant{"enqueuer, NOTIFY on a direct listen connection, pool " + poolerName,
				func(s *enqueuer.Settings) { s.ListenDatabaseURL = pool.Config().ConnString() }, pooled},
			// No direct URL: what --pooler transaction falls back to.
			latVariant{fmt.Sprintf("enqueuer, poll-only every %s (no listen URL), %s", enqueuer.DefaultSettings().SweepInterval, poolerName),
				func(s *enqueuer.Settings) { s.PollOnly = true }, pooled})
	}
	if !opts.SkipPolling {
		lvs = append(lvs, latVariant{"article: poll every 5s", func(s *enqueuer.Settings) { s.PollOnly, s.SweepInterval = true, 5*time.Second }, pool.Config()})
	}
	for _, v := range lvs {
		lat, err := b.latency(ctx, v.name, v.change, v.svcPool, opts.LatencyRate, opts.LatencyDuration)
		if err != nil {
			return nil, err
		}
		rep.Latency = append(rep.Latency, *lat)
		logf("latency %-32s p50 %s p99 %s", lat.Name, lat.P50, lat.P99)
	}
	return rep, nil
}

type bench struct {
	pool *pgxpool.Pool
	jobs int
	logf func(string, ...any)
}

// stage resets both tables and stages the backlog: receipt-like args of
// about 80 bytes, as the reference API writes them.
func (b *bench) stage(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE staged_jobs, river_job`); err != nil {
		return fmt.Errorf("stage: truncate: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args)
SELECT 'send_ride_receipt', jsonb_build_object('ride_id', g, 'user_id', g % 1000, 'email', 'rider' || g || '@example.com')
FROM generate_series(1, $1) g`, b.jobs); err != nil {
		return fmt.Errorf("stage: insert: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `VACUUM ANALYZE staged_jobs, river_job`); err != nil {
		return fmt.Errorf("stage: vacuum: %w", err)
	}
	return nil
}

// verify is the oracle after each variant: every staged row is one job.
func (b *bench) verify(ctx context.Context) error {
	var staged, jobs, distinct int
	err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM staged_jobs), (SELECT count(*) FROM river_job),
       (SELECT count(DISTINCT args->>'ride_id') FROM river_job)`).Scan(&staged, &jobs, &distinct)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if staged != 0 || jobs != b.jobs || distinct != b.jobs {
		return fmt.Errorf("verify: %d staged left, %d jobs, %d distinct, want %d", staged, jobs, distinct, b.jobs)
	}
	return nil
}

func (b *bench) singleStatement(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `
WITH moved AS (DELETE FROM staged_jobs RETURNING id, created_at, job_name, job_args)
INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at, metadata, tags)
SELECT job_args, job_name, 25, 1, 'default', 'available', now(),
       jsonb_build_object('idemd_staged_id', id, 'idemd_staged_at', created_at), '{}'
FROM moved`)
	return err
}

type benchArgs struct {
	kind string
	args json.RawMessage
}

func (a benchArgs) Kind() string                 { return a.kind }
func (a benchArgs) MarshalJSON() ([]byte, error) { return a.args, nil }

// article is the article's enqueuer: a batch of 1000 in id order, each job
// inserted on its own (River's InsertTx, the analogue of one Sidekiq
// enqueue per job), then DELETE ... WHERE id <= last id, in one transaction.
func (b *bench) article(ctx context.Context) error {
	rc, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{})
	if err != nil {
		return err
	}
	for {
		done, err := func() (bool, error) {
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				return false, err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			rows, err := tx.Query(ctx, `SELECT id, job_name, job_args FROM staged_jobs ORDER BY id LIMIT 1000`)
			if err != nil {
				return false, err
			}
			type row struct {
				id   int64
				kind string
				args []byte
			}
			batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				return x, r.Scan(&x.id, &x.kind, &x.args)
			})
			if err != nil {
				return false, err
			}
			if len(batch) == 0 {
				return true, nil
			}
			for _, r := range batch {
				md := fmt.Appendf(nil, `{"idemd_staged_id":%d}`, r.id)
				if _, err := rc.InsertTx(ctx, tx, benchArgs{kind: r.kind, args: r.args}, &river.InsertOpts{Metadata: md}); err != nil {
					return false, err
				}
			}
			if _, err := tx.Exec(ctx, `DELETE FROM staged_jobs WHERE id <= $1`, batch[len(batch)-1].id); err != nil {
				return false, err
			}
			return false, tx.Commit(ctx)
		}()
		if err != nil || done {
			return err
		}
	}
}

// newService builds an enqueuer on p with the default settings, changed by
// change (nil: the defaults).
func newService(p *pgxpool.Pool, change func(*enqueuer.Settings), reg prometheus.Registerer) (*enqueuer.Service, error) {
	cfg := enqueuer.Config{Settings: enqueuer.DefaultSettings(), Pool: p, Registry: reg}
	if change != nil {
		change(&cfg.Settings)
	}
	return enqueuer.New(cfg)
}

// startService starts an enqueuer (newService's) on a pool of its own
// with poolCfg, as a separate process would have. stop stops it and
// closes the pool; calls after the first do nothing and return its error.
func startService(ctx context.Context, poolCfg *pgxpool.Config, change func(*enqueuer.Settings), reg prometheus.Registerer) (stop func() error, err error) {
	p, err := pgxpool.NewWithConfig(ctx, poolCfg.Copy())
	if err != nil {
		return nil, err
	}
	svc, err := newService(p, change, reg)
	if err != nil {
		p.Close()
		return nil, err
	}
	if err := svc.Start(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return sync.OnceValue(func() error {
		defer p.Close()
		return svc.Stop(ctx)
	}), nil
}

// enqueuer drains with n replicas, each on its own pool as separate
// processes would be.
func (b *bench) enqueuer(n int, change func(*enqueuer.Settings)) func(context.Context) error {
	return b.replicas(n, b.pool.Config(), change)
}

// enqueuerOn drains with one replica whose pool has poolCfg (through the
// pooler).
func (b *bench) enqueuerOn(poolCfg *pgxpool.Config, change func(*enqueuer.Settings)) func(context.Context) error {
	return b.replicas(1, poolCfg, change)
}

func (b *bench) replicas(n int, poolCfg *pgxpool.Config, change func(*enqueuer.Settings)) func(context.Context) error {
	return func(ctx context.Context) error {
		var svcs []*enqueuer.Service
		for range n {
			p, err := pgxpool.NewWithConfig(ctx, poolCfg.Copy())
			if err != nil {
				return err
			}
			defer p.Close()
			s, err := newService(p, change, nil)
			if err != nil {
				return err
			}
			svcs = append(svcs, s)
		}
		errs := make(chan error, n)
		for _, s := range svcs {
			go func() {
				_, err := s.RunOnce(ctx)
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				return err
			}
		}
		return nil
	}
}

// latency stages rate jobs/s one row per transaction from several writers
// (on the direct pool) for a warm-up and then d, with a started service
// draining on a pool of svcPool, and measures for each row the time
// from its commit (the writer's INSERT returned) to the River job's
// created_at, which River's COPY sets when the enqueuer inserts it, just
// before the enqueuer's commit. Both clocks are this process's.
func (b *bench) latency(ctx context.Context, name string, change func(*enqueuer.Settings), svcPoolCfg *pgxpool.Config, rate int, d time.Duration) (*Latency, error) {
	if _, err := b.pool.Exec(ctx, `TRUNCATE staged_jobs, river_job`); err != nil {
		return nil, err
	}
	stop, err := startService(ctx, svcPoolCfg, change, nil)
	if err != nil {
		return nil, err
	}
	defer stop() //nolint:errcheck // after the explicit stop below, a no-op

	// The first seconds are a warm-up and are not measured: a daemon runs
	// for days, and its pool's first connections (each opened, authenticated
	// and filling its statement cache on first use) are not the steady state
	// the target is about. Jobs staged during the warm-up are moved and
	// checked like the others, just left out of the percentiles.
	const writers = 8
	warmup := min(2*time.Second, d/2)
	var (
		mu        sync.Mutex
		committed = make(map[int64]time.Time, rate*int(d/time.Second+1))
		warm      = make(map[int64]bool)
		firstErr  error
	)
	ticks := make(chan bool, rate) // true: a warm-up tick
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for isWarm := range ticks {
				var id int64
				err := b.pool.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{"ride_id": 1}') RETURNING id`).Scan(&id)
				at := time.Now()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				committed[id] = at
				if isWarm {
					warm[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	d += warmup
	for i := 0; time.Since(start) < d; i++ {
		// Pace against the start time, not the previous tick, so the rate
		// holds on average even when a tick is late.
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		ticks <- time.Since(start) < warmup
	}
	close(ticks)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var left int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&left); err != nil {
			return nil, err
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("latency %s: %d rows never moved", name, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return nil, err
	}

	rows, err := b.pool.Query(ctx, `SELECT (metadata->>'idemd_staged_id')::bigint, created_at FROM river_job`)
	if err != nil {
		return nil, err
	}
	var lats []time.Duration
	seen := 0
	for rows.Next() {
		var id int64
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		c, ok := committed[id]
		if !ok {
			return nil, fmt.Errorf("latency: job for unknown staged id %d", id)
		}
		seen++
		if !warm[id] {
			lats = append(lats, max(at.Sub(c), 0))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if seen != len(committed) || len(lats) == 0 {
		return nil, fmt.Errorf("latency: %d jobs for %d staged rows", seen, len(committed))
	}
	slices.Sort(lats)
	pct := func(p float64) time.Duration { return lats[min(len(lats)-1, int(p*float64(len(lats))))] }
	return &Latency{Name: name, Jobs: len(lats), P50: pct(0.50), P99: pct(0.99), Max: lats[len(lats)-1]}, nil
}

func newDatabase(ctx context.Context, adminURL string) (*pgxpool.Pool, func(), error) {
	dbURL, dropDB, err := scratchdb.Create(ctx, adminURL, "idemd_bench_enqueuer")
	if err != nil {
		return nil, nil, fmt.Errorf("enqueuerbench: %w", err)
	}
	drop := func() { dropDB(context.Background()) } //nolint:errcheck
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		pool.Close()
		drop()
		return nil, nil, fmt.Errorf("enqueuerbench: migrate: %w", err)
	}
	return pool, drop, nil
}

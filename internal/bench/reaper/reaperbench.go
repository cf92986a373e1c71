// Package reaperbench measures the reaper against its two anchors on one
// freshly loaded table: the article's delete loop (DELETE ... WHERE id IN
// (SELECT id ... WHERE created_at < X LIMIT 1000), no created_at index) and
// one single DELETE (the raw limit). The same three run again on the schema
// with the article's rides table referencing the keys (ON DELETE SET NULL),
// and the reaper's run there is compared with the anchors on that schema.
// It also times an idle pass and the p99 of a concurrent single-row insert
// workload with and without the reaper.
//
// Run creates (and drops) its own database, so the project's report can
// call it against any server it may write to.
package reaperbench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Options size the benchmark. Zero values take the defaults.
type Options struct {
	// Keys in the table, half of them past retention. Default 2,000,000.
	Keys int
	// Settings of the reaper under test (retention is fixed at 72h).
	// Default: reaper.DefaultSettings() without load limits.
	Reaper *reaper.Settings
	// InsertRate of the concurrent workload, inserts per second. Default 500.
	InsertRate int
	// BaselineDuration of the workload without the reaper, per round.
	// Default 5s, about as long as the reaper's run.
	BaselineDuration time.Duration
	// ThroughputRounds: the reaper, the article's loop and the single
	// DELETE each run this many times (on a fresh load each) and keep their
	// fastest. Default 2.
	ThroughputRounds int
	// LatencyRounds: the insert comparison is repeated on this many fresh
	// loads and pooled. Default 5.
	LatencyRounds int
	// SkipRides skips the runs with the article's rides table (ON DELETE SET
	// NULL, one ride per two keys): the reaper, the article's loop and the
	// single DELETE on that schema, three more loads per throughput round.
	SkipRides bool
	// Concurrency of the extra reaper runs, one on each schema, beside the
	// runs with the settings under test. Default 2; 1 skips them.
	Concurrency int
	// RidesOnly runs only the runs on the schema with the rides foreign key
	// (the reaper, with and without Concurrency, and both anchors).
	RidesOnly bool
	// LatencyOnly measures only the concurrent insert p99 (for tuning the
	// batch size and pause against it; the ratios need the full run).
	LatencyOnly bool
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
}

// Row is one measured deletion strategy.
type Row struct {
	Name       string
	Deleted    int64
	Duration   time.Duration
	KeysPerSec float64
	// WALBytes the server wrote during the deletion (its WAL insert position
	// before and after): the deletion's own WAL, as nothing else in the
	// benchmark writes during the throughput runs (the server's other
	// databases and autovacuum could).
	WALBytes int64
	// UnderTest marks the reaper with the settings under test, the row the
	// throughput targets are checked against.
	UnderTest bool
	// Rides marks a run on the schema with the article's rides table
	// referencing the keys (ON DELETE SET NULL); its ratios are against the
	// anchors run on that same schema.
	Rides bool
	// Concurrency of a reaper run (--concurrency); 0 for the anchors.
	Concurrency int
	// Ratios against the anchors (keys/s over the anchor's keys/s).
	VsArticle float64
	VsSingle  float64
}

// Report is the outcome of Run.
type Report struct {
	Keys           int
	PastRetention  int
	AvgParamsBytes int
	LoadDuration   time.Duration
	Settings       reaper.Settings

	Rows []Row

	// Idle passes (nothing to reap) after vacuum: the steady state.
	IdleReaper  time.Duration // median of several idle runs
	IdleArticle time.Duration // one iteration of the article's loop finding nothing
	// The same right after a run deleted the old half, before vacuum.
	IdleReaperDirty  time.Duration
	IdleArticleDirty time.Duration

	// ThroughputRounds: each row is the fastest of this many runs.
	ThroughputRounds int
	InsertRate       int
	LatencyRounds    int
	// Insert compares the inserts' p99 with the reaper under test against
	// their baseline; InsertServerWAL does the same for the reaper with the
	// server's wal_compression (nil when that is the setting under test).
	Insert          LatencyComparison
	InsertServerWAL *LatencyComparison
	// InsertConcurrent does the same for the reaper with Options'
	// Concurrency (nil when that is 1).
	InsertConcurrent *LatencyComparison
	// ServerWALCompression is the server's wal_compression.
	ServerWALCompression string
	// RidesOnly: only the runs with the rides foreign key were measured.
	RidesOnly bool
	// Concurrency of the extra reaper runs (1: none ran).
	Concurrency int
}

const retention = 72 * time.Hour

// Run creates a database on the server of adminURL, loads it and measures.
func Run(ctx context.Context, adminURL string, opts Options) (*Report, error) {
	opts.Keys = cmp.Or(opts.Keys, 2_000_000)
	opts.InsertRate = cmp.Or(opts.InsertRate, 500)
	opts.BaselineDuration = cmp.Or(opts.BaselineDuration, 5*time.Second)
	opts.LatencyRounds = cmp.Or(opts.LatencyRounds, 5)
	opts.ThroughputRounds = cmp.Or(opts.ThroughputRounds, 2)
	opts.Concurrency = cmp.Or(opts.Concurrency, 2)
	if opts.Reaper == nil {
		s := reaper.DefaultSettings()
		// This suite measures how fast the batches delete, on the shared
		// server: the load limits would pace it to that server's
		// checkpoint settings and every other database's WAL. The standby
		// suite, on a private cluster, measures the limits.
		s.Throttle.MaxLoad = ""
		opts.Reaper = &s
	}
	opts.Reaper.Retention = retention
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}

	dbURL, drop, err := scratchdb.Create(ctx, adminURL, "idemd_reaperbench")
	if err != nil {
		return nil, fmt.Errorf("reaperbench: %w", err)
	}
	defer drop(context.WithoutCancel(ctx)) //nolint:errcheck

	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("reaperbench: parse url: %w", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("reaperbench: pool: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		return nil, fmt.Errorf("reaperbench: migrate: %w", err)
	}

	// Open every connection the workload may use now, so the first inserts
	// measure the table and not connection set-up.
	conns := make([]*pgxpool.Conn, cfg.MaxConns)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return nil, fmt.Errorf("reaperbench: warm pool: %w", err)
		}
	}
	for _, c := range conns {
		c.Release()
	}

	bn := &bench{pool: pool, opts: opts, logf: logf}
	return bn.run(ctx)
}

type bench struct {
	pool *pgxpool.Pool
	opts Options
	logf func(string, ...any)
	// indexDefs are the idempotency_keys indexes other than the primary key,
	// dropped before a load and rebuilt after (much faster than maintaining
	// them row by row).
	indexDefs map[string]string
	// serverWAL is the server's wal_compression.
	serverWAL string
	// preparedAt is the database's now() when bench_src was generated.
	preparedAt time.Time
	// standbyURL, in the standby suite, is the standby's admin URL: a
	// restartpoint there after each load (standbyRound).
	standbyURL string
	// reaperLog, when set, is the reaper's logger (StandbyOptions.ReaperLog),
	// maxRuntime each standby run's bound (StandbyOptions.MaxRuntime).
	reaperLog  *zap.Logger
	maxRuntime time.Duration
}

func (b *bench) run(ctx context.Context) (*Report, error) {
	r := &Report{RidesOnly: b.opts.RidesOnly, Concurrency: b.opts.Concurrency, Keys: b.opts.Keys, Settings: *b.opts.Reaper, InsertRate: b.opts.InsertRate, LatencyRounds: b.opts.LatencyRounds, ThroughputRounds: b.opts.ThroughputRounds}
	if err := b.prepare(ctx, r); err != nil {
		return nil, err
	}
	r.ServerWALCompression = b.serverWAL
	// A reaper refused its wal_compression would fall back to the server's
	// setting quietly, and every row would be mislabelled: refuse instead.
	if err := b.onAnchorConn(ctx, func(*pgx.Conn) error { return nil }); err != nil {
		return nil, fmt.Errorf("%w (run as a superuser, or benchmark the reaper with --wal-compression server)", err)
	}
	if b.opts.LatencyOnly {
		if err := b.load(ctx, r, false); err != nil {
			return nil, err
		}
		return r, b.insertLatency(ctx, r)
	}

	// 1-3. The reaper, the article's loop and one single DELETE, each on a
	// fresh load, ThroughputRounds times in turn so that a slow spell of the
	// machine hits all three alike; each keeps its fastest run. One run of
	// the single DELETE varies by a third between runs here, and every
	// ratio is against it.
	// When the reaper sets its own wal_compression, a fourth run shows the
	// reaper with the server's.
	best := map[string]Row{}
	var order []string
	keep := func(row Row) {
		if old, ok := best[row.Name]; !ok || row.Duration < old.Duration {
			if !ok {
				order = append(order, row.Name)
			}
			best[row.Name] = row
		}
	}
	for round := range b.opts.ThroughputRounds {
		if b.opts.RidesOnly {
			break
		}
		first := round == 0
		row, err := b.reaperRound(ctx, r, first)
		if err != nil {
			return nil, err
		}
		keep(row)
		if row, err = b.articleRound(ctx, r, first, false); err != nil {
			return nil, err
		}
		keep(row)
		if row, err = b.singleDelete(ctx, r, false); err != nil {
			return nil, err
		}
		keep(row)
		if b.opts.Reaper.WALCompression != "server" {
			if row, err = b.reaperOnFreshLoad(ctx, r, false, keepServerWAL); err != nil {
				return nil, err
			}
			keep(row)
		}
		if b.opts.Concurrency > 1 {
			if row, err = b.reaperOnFreshLoad(ctx, r, false, b.concurrent); err != nil {
				return nil, err
			}
			keep(row)
		}
	}

	// 4. The reaper with the article's rides table referencing the keys,
	// and both anchors on that same schema: every key deleted sets its
	// ride's reference to NULL, for the anchors as for the reaper, so the
	// ratios compare like with like. Fastest of ThroughputRounds each, as
	// above.
	if !b.opts.SkipRides {
		for range b.opts.ThroughputRounds {
			row, err := b.reaperOnFreshLoad(ctx, r, true, nil)
			if err != nil {
				return nil, err
			}
			keep(row)
			if b.opts.Concurrency > 1 {
				if row, err = b.reaperOnFreshLoad(ctx, r, true, b.concurrent); err != nil {
					return nil, err
				}
				keep(row)
			}
			if row, err = b.articleRound(ctx, r, false, true); err != nil {
				return nil, err
			}
			keep(row)
			if row, err = b.singleDelete(ctx, r, true); err != nil {
				return nil, err
			}
			keep(row)
		}
	}
	for _, name := range order {
		r.Rows = append(r.Rows, best[name])
	}

	// 5. Insert p99 without and with the reaper, on a freshly loaded table.
	if b.opts.RidesOnly {
		setRatios(r)
		return r, nil
	}
	if err := b.load(ctx, r, false); err != nil {
		return nil, err
	}
	if err := b.insertLatency(ctx, r); err != nil {
		return nil, err
	}

	setRatios(r)
	return r, nil
}

// setRatios sets every row's ratios against the anchors of its schema: with
// and without the rides foreign key.
func setRatios(r *Report) {
	article, single := map[bool]float64{}, map[bool]float64{}
	for _, row := range r.Rows {
		switch {
		case strings.HasPrefix(row.Name, "article"):
			article[row.Rides] = row.KeysPerSec
		case strings.HasPrefix(row.Name, "single"):
			single[row.Rides] = row.KeysPerSec
		}
	}
	for i := range r.Rows {
		if a := article[r.Rows[i].Rides]; a > 0 {
			r.Rows[i].VsArticle = r.Rows[i].KeysPerSec / a
		}
		if s := single[r.Rows[i].Rides]; s > 0 {
			r.Rows[i].VsSingle = r.Rows[i].KeysPerSec / s
		}
	}
}

// concurrent makes the reaper run --concurrency batches at once.
func (b *bench) concurrent(s *reaper.Settings) { s.Concurrency = b.opts.Concurrency }

// reaperRound times one reaper run on a fresh load; with idle, also the
// idle passes on the reaped table.
func (b *bench) reaperRound(ctx context.Context, r *Report, idle bool) (Row, error) {
	row, err := b.reaperOnFreshLoad(ctx, r, false, nil)
	row.UnderTest = true
	if err != nil || !idle {
		return row, err
	}
	if r.IdleReaperDirty, err = b.medianIdlePass(ctx); err != nil {
		return Row{}, err
	}
	// Until (auto)vacuum runs, the index still holds the entries of the keys
	// just deleted and an idle pass walks over them. Measure the steady
	// state too: the next scheduled run normally finds the table vacuumed
	// (deleting half of it is far past autovacuum's 20% threshold).
	if _, err := b.pool.Exec(ctx, "VACUUM idempotency_keys"); err != nil {
		return Row{}, fmt.Errorf("reaperbench: vacuum: %w", err)
	}
	if r.IdleReaper, err = b.medianIdlePass(ctx); err != nil {
		return Row{}, err
	}
	b.logf("reaper idle pass: %s right after the run, %s after vacuum", r.IdleReaperDirty, r.IdleReaper)
	return row, nil
}

// reaperOnFreshLoad times one reaper run on a fresh load; with rides, on
// the schema with the rides foreign key (named and marked so); mutate
// adjusts the settings under test.
func (b *bench) reaperOnFreshLoad(ctx context.Context, r *Report, rides bool, mutate func(*reaper.Settings)) (Row, error) {
	if err := b.load(ctx, r, rides); err != nil {
		return Row{}, err
	}
	name := "reaper"
	if rides {
		name += ", " + ridesFK
	}
	row, err := b.timeReaper(ctx, name, mutate)
	row.Rides = rides
	return row, err
}

// ridesFK names the runs on the schema with the rides foreign key.
const ridesFK = "rides ON DELETE SET NULL"

// articleRound times the article's loop on a fresh load without the
// created_at index; with idle, also its idle passes; with rides, on the
// schema with the rides foreign key.
func (b *bench) articleRound(ctx context.Context, r *Report, idle, rides bool) (Row, error) {
	if err := b.load(ctx, r, rides); err != nil {
		return Row{}, err
	}
	if _, err := b.pool.Exec(ctx, "DROP INDEX idempotency_keys_created_at"); err != nil {
		return Row{}, fmt.Errorf("reaperbench: drop created_at index: %w", err)
	}
	var row Row
	err := b.onAnchorConn(ctx, func(conn *pgx.Conn) error {
		var lastPass time.Duration
		var err error
		if row, lastPass, err = b.timeArticleLoop(ctx, conn); err != nil || !idle {
			return err
		}
		r.IdleArticleDirty = lastPass
		if _, err := conn.Exec(ctx, "VACUUM idempotency_keys"); err != nil {
			return fmt.Errorf("reaperbench: vacuum: %w", err)
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, articleLoopSQL, retention.Microseconds()); err != nil {
			return fmt.Errorf("reaperbench: article idle pass: %w", err)
		}
		r.IdleArticle = time.Since(start)
		return nil
	})
	if err != nil {
		return Row{}, err
	}
	if _, err := b.pool.Exec(ctx, b.indexDefs["idempotency_keys_created_at"]); err != nil {
		return Row{}, fmt.Errorf("reaperbench: recreate created_at index: %w", err)
	}
	return onRides(row, rides), nil
}

// onRides names and marks a run on the schema with the rides foreign key.
func onRides(row Row, rides bool) Row {
	if rides {
		row.Name += ", " + ridesFK
		row.Rides = true
	}
	return row
}

// singleDelete times one DELETE of every key past retention on a fresh
// load; with rides, on the schema with the rides foreign key.
func (b *bench) singleDelete(ctx context.Context, r *Report, rides bool) (Row, error) {
	if err := b.load(ctx, r, rides); err != nil {
		return Row{}, err
	}
	var row Row
	err := b.onAnchorConn(ctx, func(conn *pgx.Conn) error {
		lsn, err := b.walLSN(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		tag, err := conn.Exec(ctx, "DELETE FROM idempotency_keys WHERE created_at < now() - $1::bigint * interval '1 microsecond'", retention.Microseconds())
		if err != nil {
			return fmt.Errorf("reaperbench: single delete: %w", err)
		}
		d := time.Since(start)
		b.logf("single DELETE (rides: %v): %d keys in %s", rides, tag.RowsAffected(), d)
		row = onRides(newRow("single DELETE (raw limit)", tag.RowsAffected(), d), rides)
		row.WALBytes, err = b.walSince(ctx, lsn)
		return err
	})
	return row, err
}

// onAnchorConn runs fn on a connection whose wal_compression is the
// reaper's: most of the WAL of any deletion here is full-page images, and
// the anchors are to measure the strategies, not the WAL setting.
func (b *bench) onAnchorConn(ctx context.Context, fn func(*pgx.Conn) error) error {
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("reaperbench: acquire: %w", err)
	}
	defer c.Release()
	if w := b.opts.Reaper.WALCompression; w != "server" {
		if _, err := c.Exec(ctx, "SELECT set_config('wal_compression', $1, false)", w); err != nil {
			return fmt.Errorf("reaperbench: set wal_compression: %w", err)
		}
		defer func() {
			// A connection whose RESET failed would lend the setting to
			// whatever uses it next (the insert workload, the reaper on the
			// server's setting): close it instead.
			if _, err := c.Exec(context.WithoutCancel(ctx), "RESET wal_compression"); err != nil {
				_ = c.Conn().Close(context.WithoutCancel(ctx))
			}
		}()
	}
	return fn(c.Conn())
}

// prepare builds the source rows once: ids in created_at order spread over
// twice the retention, so half are past it; every 1000th key unfinished;
// request_params of about 200 bytes.
func (b *bench) prepare(ctx context.Context, r *Report) error {
	b.logf("generating %d keys", b.opts.Keys)
	_, err := b.pool.Exec(ctx, `
CREATE UNLOGGED TABLE bench_src AS
SELECT g AS id,
       now() - interval '144 hours' + (g::float8 / $1) * interval '144 hours' AS created_at,
       'key-' || g AS idempotency_key,
       jsonb_build_object(
           'origin_lat', round((random() * 180 - 90)::numeric, 8),
           'origin_lon', round((random() * 360 - 180)::numeric, 8),
           'target_lat', round((random() * 180 - 90)::numeric, 8),
           'target_lon', round((random() * 360 - 180)::numeric, 8),
           'amount', g % 100000,
           'currency', 'usd',
           'description', 'Rocket ride ' || md5(g::text)) AS request_params,
       CASE WHEN g % 1000 = 0 THEN 'started' ELSE 'finished' END AS recovery_point,
       g % 50000 AS user_id
FROM generate_series(1, $1::int) g`, b.opts.Keys)
	if err != nil {
		return fmt.Errorf("reaperbench: generate: %w", err)
	}
	if err := b.pool.QueryRow(ctx, "SELECT avg(pg_column_size(request_params))::int, count(*) FILTER (WHERE created_at < now() - interval '72 hours'), now(), current_setting('wal_compression') FROM bench_src").Scan(&r.AvgParamsBytes, &r.PastRetention, &b.preparedAt, &b.serverWAL); err != nil {
		return fmt.Errorf("reaperbench: measure source: %w", err)
	}
	rows, err := b.pool.Query(ctx, "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'idempotency_keys' AND indexname <> 'idempotency_keys_pkey'")
	if err != nil {
		return fmt.Errorf("reaperbench: list indexes: %w", err)
	}
	b.indexDefs = map[string]string{}
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			return fmt.Errorf("reaperbench: list indexes: %w", err)
		}
		b.indexDefs[n] = d
	}
	return rows.Err()
}

// load empties the tables and reloads every key, in created_at order like a
// table the API filled over time, then vacuums so each measurement starts
// from the same clean state.
func (b *bench) load(ctx context.Context, r *Report, rides bool) error {
	start := time.Now()
	stmts := []string{
		"DROP TABLE IF EXISTS rides",
		"TRUNCATE idempotency_keys, idempotency_key_reviews",
	}
	for n := range b.indexDefs {
		stmts = append(stmts, "DROP INDEX IF EXISTS "+pgx.Identifier{n}.Sanitize())
	}
	stmts = append(stmts, `
INSERT INTO idempotency_keys (id, created_at, idempotency_key, last_run_at, locked_at, request_method,
                              request_params, request_path, response_code, response_body, recovery_point, user_id)
SELECT id, created_at + (now() - $1::timestamptz), idempotency_key, created_at, NULL, 'POST', request_params, '/charges',
       CASE WHEN recovery_point = 'finished' THEN 201 END,
       CASE WHEN recovery_point = 'finished' THEN '{"id":' || id || '}' END,
       recovery_point, user_id
FROM bench_src ORDER BY id`)
	for _, d := range b.indexDefs {
		stmts = append(stmts, d)
	}
	if rides {
		stmts = append(stmts, `
CREATE TABLE rides (
    id BIGSERIAL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key_id BIGINT REFERENCES idempotency_keys ON DELETE SET NULL,
    origin_lat NUMERIC(13,10) NOT NULL,
    origin_lon NUMERIC(13,10) NOT NULL,
    target_lat NUMERIC(13,10) NOT NULL,
    target_lon NUMERIC(13,10) NOT NULL,
    stripe_charge_id TEXT,
    user_id BIGINT NOT NULL)`,
			`INSERT INTO rides (created_at, idempotency_key_id, origin_lat, origin_lon, target_lat, target_lon, stripe_charge_id, user_id)
SELECT created_at, id, 1, 2, 3, 4, 'ch_' || id, user_id FROM bench_src WHERE id % 2 = 0 ORDER BY id`,
			// The article's index: without it every deleted key costs a scan
			// of rides.
			"CREATE UNIQUE INDEX rides_idempotency_key_id ON rides (idempotency_key_id) WHERE idempotency_key_id IS NOT NULL",
			"VACUUM ANALYZE rides")
	}
	// A checkpoint now, so the load's gigabytes of WAL are not flushed in
	// the middle of a measurement (needs superuser; skipped otherwise).
	stmts = append(stmts, "VACUUM ANALYZE idempotency_keys", "VACUUM ANALYZE idempotency_key_reviews", "CHECKPOINT")
	// Every load places the keys at the same ages relative to its own now(),
	// so each strategy deletes the same keys.
	args := func(s string) []any {
		if strings.Contains(s, "$1") {
			return []any{b.preparedAt}
		}
		return nil
	}
	for _, s := range stmts {
		if _, err := b.pool.Exec(ctx, s, args(s)...); err != nil {
			if s == "CHECKPOINT" {
				b.logf("checkpoint skipped: %v", err)
				continue
			}
			return fmt.Errorf("reaperbench: load: %s: %w", strings.Fields(s)[0], err)
		}
	}
	if _, err := b.pool.Exec(ctx, "SELECT setval('idempotency_keys_id_seq', $1::bigint)", b.opts.Keys); err != nil {
		return fmt.Errorf("reaperbench: setval: %w", err)
	}
	r.LoadDuration = time.Since(start)
	b.logf("loaded %d keys (rides: %v) in %s", b.opts.Keys, rides, r.LoadDuration)
	return nil
}

func newRow(name string, deleted int64, d time.Duration) Row {
	return Row{Name: name, Deleted: deleted, Duration: d, KeysPerSec: float64(deleted) / d.Seconds()}
}

// keepServerWAL makes the reaper keep the server's wal_compression.
func keepServerWAL(s *reaper.Settings) { s.WALCompression = "server" }

// timeReaper does one reaper run with the benchmark's settings.
func (b *bench) timeReaper(ctx context.Context, name string, mutate func(*reaper.Settings)) (Row, error) {
	s := *b.opts.Reaper
	if mutate != nil {
		mutate(&s)
	}
	svc, err := reaper.New(reaper.Config{Settings: s, Pool: b.pool, Logger: zap.NewNop()})
	if err != nil {
		return Row{}, err
	}
	lsn, err := b.walLSN(ctx)
	if err != nil {
		return Row{}, err
	}
	res, err := svc.RunOnce(ctx)
	if err != nil {
		return Row{}, fmt.Errorf("reaperbench: %s: %w", name, err)
	}
	if !res.Complete {
		return Row{}, fmt.Errorf("reaperbench: %s: run incomplete (%s)", name, res.StopReason)
	}
	conc := ""
	if s.Concurrency > 1 {
		conc = fmt.Sprintf(", concurrency %d", s.Concurrency)
	}
	row := newRow(fmt.Sprintf("%s (batch %d, pause %s, wal_compression %s%s)", name, s.BatchSize, s.BatchPause, walName(s.WALCompression, b.serverWAL), conc), res.Deleted, res.Duration)
	row.Concurrency = s.Concurrency
	if row.WALBytes, err = b.walSince(ctx, lsn); err != nil {
		return Row{}, err
	}
	if name != "idle" {
		b.logf("%s: %d keys, %d flagged, %d batches in %s, %s of WAL", row.Name, res.Deleted, res.Flagged, res.Batches, res.Duration, mb(row.WALBytes))
	}
	return row, nil
}

// medianIdlePass is the median of seven reaper runs that find nothing to
// reap (one pass is too noisy on a shared machine).
func (b *bench) medianIdlePass(ctx context.Context) (time.Duration, error) {
	idle := make([]time.Duration, 0, 7)
	for range 7 {
		d, err := b.timeReaper(ctx, "idle", nil)
		if err != nil {
			return 0, err
		}
		idle = append(idle, d.Duration)
	}
	return median(idle), nil
}

// median of a non-empty list (the upper one of an even count).
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// articleLoopSQL is the article's reaper statement.
const articleLoopSQL = `
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT id FROM idempotency_keys
    WHERE created_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT 1000
)`

// timeArticleLoop runs the article's loop until a pass comes back short of
// its LIMIT, the reaper's own stopping rule. (Looping until a pass deletes
// nothing never ends on a big table: keys keep crossing the horizon faster
// than a full scan takes.) It returns the time of that last, short pass as
// its idle pass before vacuum.
func (b *bench) timeArticleLoop(ctx context.Context, conn *pgx.Conn) (Row, time.Duration, error) {
	var total int64
	lsn, err := b.walLSN(ctx)
	if err != nil {
		return Row{}, 0, err
	}
	start := time.Now()
	var last time.Duration
	for {
		passStart := time.Now()
		tag, err := conn.Exec(ctx, articleLoopSQL, retention.Microseconds())
		if err != nil {
			return Row{}, 0, fmt.Errorf("reaperbench: article loop: %w", err)
		}
		last = time.Since(passStart)
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			break
		}
	}
	d := time.Since(start)
	row := newRow("article loop (LIMIT 1000, no index)", total, d)
	if row.WALBytes, err = b.walSince(ctx, lsn); err != nil {
		return Row{}, 0, err
	}
	b.logf("article loop: %d keys in %s, last pass %s, %s of WAL", total, d, last, mb(row.WALBytes))
	return row, last, nil
}

// walLSN is the server's WAL insert position.
func (b *bench) walLSN(ctx context.Context) (string, error) {
	var lsn string
	if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return "", fmt.Errorf("reaperbench: wal position: %w", err)
	}
	return lsn, nil
}

// walSince is how many bytes of WAL the server wrote since lsn.
func (b *bench) walSince(ctx context.Context, lsn string) (int64, error) {
	var n int64
	if err := b.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", lsn).Scan(&n); err != nil {
		return 0, fmt.Errorf("reaperbench: wal written: %w", err)
	}
	return n, nil
}

func mb(n int64) string { return fmt.Sprintf("%.0f MB", float64(n)/1e6) }

// LatencyComparison is the p99 of the insert workload alone and while one
// reaper configuration runs.
type LatencyComparison struct {
	Baseline, WithReaper Latency // all rounds pooled
	// P99Ratio is WithReaper.P99 over Baseline.P99.
	P99Ratio float64
	// RoundRatios are each round's p99 with the reaper over the p99 of the
	// baseline window just before it, and P99RoundMedian their median: each
	// reaper window is compared with the machine's state of the moment, so
	// a noisy spell inflates neither side alone. This is the figure the
	// target is checked against.
	RoundRatios    []float64
	P99RoundMedian float64

	base, with []time.Duration
}

func (c *LatencyComparison) add(base, with []time.Duration) {
	c.base, c.with = append(c.base, base...), append(c.with, with...)
	c.RoundRatios = append(c.RoundRatios, float64(newLatency(with).P99)/float64(newLatency(base).P99))
	c.Baseline, c.WithReaper = newLatency(c.base), newLatency(c.with)
	c.P99Ratio = float64(c.WithReaper.P99) / float64(c.Baseline.P99)
	c.P99RoundMedian = median(c.RoundRatios)
}

func (c *LatencyComparison) String() string {
	return fmt.Sprintf("  alone:                 %s\n  while the reaper runs: %s\n  p99 ratio pooled: %.2fx; per round: %s (median %.2fx)\n",
		c.Baseline, c.WithReaper, c.P99Ratio, ratioList(c.RoundRatios), c.P99RoundMedian)
}

// insertLatency measures single-row inserts at InsertRate alone and while
// the reaper deletes the old half, in LatencyRounds rounds on a freshly
// loaded table each. A round is an unmeasured warm-up, a baseline window
// of BaselineDuration, then the reaper's run; each side's p99 is over the
// inserts of all rounds. One reaper run lasts a few seconds, so a single
// window's p99 is its ~20 worst inserts, and one stall of this shared
// machine moves it by a factor of two either way. When the reaper under
// test sets its own wal_compression, each round is followed by one of the
// reaper with the server's, so the two are measured through the same
// spells of the machine.
func (b *bench) insertLatency(ctx context.Context, r *Report) error {
	type config struct {
		name   string
		mutate func(*reaper.Settings)
		into   *LatencyComparison
	}
	configs := []config{{name: "reaper under insert load", into: &r.Insert}}
	if b.opts.Reaper.WALCompression != "server" {
		r.InsertServerWAL = &LatencyComparison{}
		configs = append(configs, config{"reaper with the server's wal_compression under insert load", keepServerWAL, r.InsertServerWAL})
	}
	if b.opts.Concurrency > 1 {
		r.InsertConcurrent = &LatencyComparison{}
		configs = append(configs, config{fmt.Sprintf("reaper with --concurrency %d under insert load", b.opts.Concurrency), b.concurrent, r.InsertConcurrent})
	}
	idle := func(d time.Duration) func(context.Context) error {
		return func(ctx context.Context) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return nil
		}
	}
	loaded := true // the caller loaded the table for the first round
	for round := range b.opts.LatencyRounds {
		// Alternate which configuration goes first, so neither always meets
		// the machine right after a load.
		order := slices.Clone(configs)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			if !loaded {
				if err := b.load(ctx, r, false); err != nil {
					return err
				}
			}
			loaded = false
			// The warm-up: the first inserts into a freshly loaded table read
			// its index pages into shared buffers and build each connection's
			// cached plans, and take up to hundreds of milliseconds. Measured
			// cold, the baseline's p99 would be that warm-up, and the run with
			// the reaper (on the then warm table) would look better than it.
			if _, err := b.workload(ctx, idle(3*time.Second)); err != nil {
				return err
			}
			bl, err := b.workload(ctx, idle(b.opts.BaselineDuration))
			if err != nil {
				return err
			}
			wl, err := b.workload(ctx, func(ctx context.Context) error {
				_, err := b.timeReaper(ctx, c.name, c.mutate)
				return err
			})
			if err != nil {
				return err
			}
			b.logf("insert latency round %d, %s: alone %s; with the reaper %s", round+1, c.name, newLatency(bl), newLatency(wl))
			c.into.add(bl, wl)
		}
	}
	b.logf("insert latency, all rounds: alone %s; with the reaper %s", r.Insert.Baseline, r.Insert.WithReaper)
	return nil
}

// Latency summarises the insert latencies of one side of the comparison.
type Latency struct {
	N                  int
	P50, P90, P99, Max time.Duration
}

func newLatency(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q int) time.Duration { return s[(len(s)*q)/100] }
	return Latency{N: len(s), P50: at(50), P90: at(90), P99: at(99), Max: s[len(s)-1]}
}

func (l Latency) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s (%d inserts)", r(l.P50), r(l.P90), r(l.P99), r(l.Max), l.N)
}

var workloadSeq atomic.Int64

// workload issues inserts at a fixed rate while during runs, and returns
// their latencies. Open loop: latency counts from when the insert was due,
// so a stalled table shows up as latency rather than as fewer inserts.
func (b *bench) workload(ctx context.Context, during func(context.Context) error) ([]time.Duration, error) {
	w, err := b.workloadTimed(ctx, during)
	return w.lat, err
}

// timedInserts are the workload's inserts, in the order they finished:
// each one's latency, when it was due, and how late it was sent (from
// when it was due to when this process handed it to the pool). An insert
// late to leave waited for this process (its goroutines, the machine's
// CPU), not for the server.
type timedInserts struct {
	lat, late []time.Duration
	due       []time.Time
}

// workloadTimed is workload that also returns when each insert was due
// and how late it left.
func (b *bench) workloadTimed(ctx context.Context, during func(context.Context) error) (w timedInserts, err error) {
	wctx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(b.opts.InsertRate)
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now()
		for {
			next = next.Add(interval)
			wait := time.Until(next)
			t := time.NewTimer(wait)
			select {
			case <-wctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			due := next
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := workloadSeq.Add(1)
				sent := time.Now()
				_, err := b.pool.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
VALUES ($1, now(), 'POST', '{"amount": 100, "currency": "usd"}', '/charges', 'started', $2)`, fmt.Sprintf("load-%d", n), n%50000)
				d := time.Since(due)
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				w.lat = append(w.lat, d)
				w.late = append(w.late, sent.Sub(due))
				w.due = append(w.due, due)
			}()
		}
	}()
	err = during(wctx)
	stop()
	wg.Wait()
	if err != nil {
		return timedInserts{}, err
	}
	if firstErr != nil {
		return timedInserts{}, fmt.Errorf("reaperbench: insert workload: %w", firstErr)
	}
	return w, nil
}

// String renders the report as the table docs/reaper.md quotes.
func (r *Report) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "reaper benchmark: %d keys, %d past retention, request_params ~%d bytes (jsonb); fastest of %d runs each\n\n", r.Keys, r.PastRetention, r.AvgParamsBytes, r.ThroughputRounds)
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tdeleted\ttime\tkeys/s\tWAL\tvs article loop\tvs single DELETE")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%s\t%.2fx\t%.2fx\n", row.Name, row.Deleted, row.Duration.Round(time.Millisecond), row.KeysPerSec, mb(row.WALBytes), row.VsArticle, row.VsSingle)
	}
	_ = tw.Flush()
	fmt.Fprintf(&sb, "(rows with %s are compared with the anchors run on that schema)\n", ridesFK)
	if r.RidesOnly {
		// No idle passes and no insert latency were measured.
		return sb.String()
	}
	fmt.Fprintf(&sb, "\nidle pass (nothing to reap), table vacuumed: reaper %s, article loop %s\n", r.IdleReaper.Round(10*time.Microsecond), r.IdleArticle.Round(10*time.Microsecond))
	fmt.Fprintf(&sb, "idle pass right after deleting the old half, before vacuum: reaper %s, article loop %s\n", r.IdleReaperDirty.Round(10*time.Microsecond), r.IdleArticleDirty.Round(10*time.Microsecond))
	fmt.Fprintf(&sb, "single-row inserts at %d/s, %d rounds pooled, reaper with wal_compression %s:\n%s", r.InsertRate, r.LatencyRounds, walName(r.Settings.WALCompression, r.ServerWALCompression), &r.Insert)
	if r.InsertServerWAL != nil {
		fmt.Fprintf(&sb, "the same, reaper with the server's wal_compression (%s), rounds interleaved:\n%s", r.ServerWALCompression, r.InsertServerWAL)
	}
	if r.InsertConcurrent != nil {
		fmt.Fprintf(&sb, "the same, reaper with --concurrency %d, rounds interleaved:\n%s", r.Concurrency, r.InsertConcurrent)
	}
	return sb.String()
}

// walName names a --wal-compression setting as the session sees it.
func walName(setting, server string) string {
	if setting == "server" {
		return server + " (the server's)"
	}
	return setting
}

func ratioList(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.2fx", r)
	}
	return strings.Join(parts, ", ")
}

package load

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/migrations"
)

// The migrations benchmark: what `idemctl migrate` costs an API that is
// serving, on a large table. A database is brought to an older schema
// (every River migration, idemd's up to MigrationsOptions.From), seeded
// with Keys keys, and an API-shaped load runs at a fixed rate: a request
// inserts its key, moves it through the Rocket Rides phases, each phase its
// own transaction, the last one staging its receipt job. After a window of
// the load alone, the current idemctl binary migrates the database while the
// load goes on. Each migration's duration is the one River's migrator and
// goose log, the API's latencies are
// measured from each request's scheduled start (so a queue behind a lock
// counts), and a stall is the longest gap between two commits.
//
// Each migration's window is read from idemctl's log (its end, to the
// millisecond, less its logged duration). For each, the report gives the
// API requests that overlap it (their p99, max and count) and the longest
// gap between two commits that overlaps it, and what a sampler of pg_locks
// saw in it (locksample.go): the relation locks the migrator's sessions
// held or awaited and the API's sessions' waits for a lock. From 00011 the
// database also holds River jobs and staged jobs (MigrationsOptions.Jobs),
// as an installation that has run for a while does.

// MigrationsOptions tune the benchmark.
type MigrationsOptions struct {
	Keys int   // keys seeded (10,000,000 when zero)
	From int64 // idemd migrations applied before (11 when zero)
	// Article starts instead from the article's schema (its
	// idempotency_keys, users and staged_jobs, no River, no idemd): the
	// adoption of idemd by an API that has run for a while, where
	// migrate adds the key columns and builds the created_at index
	// CONCURRENTLY on the whole table.
	Article bool
	// Jobs is the number of river_job rows and of staged_jobs rows seeded
	// (1,000,000 each when zero; no river_job from the article's schema,
	// which has no River). No enqueuer runs: the staged rows stay.
	Jobs   int
	Rate   int           // API requests a second (50 when zero)
	Before time.Duration // the window measured before migrating (20s when zero)
	// LockSampleInterval is how often pg_locks is sampled, from the
	// window before the migration (whose API figures then bear the
	// sampler's cost too) to the migration's end (5 ms when zero).
	LockSampleInterval time.Duration
	// SharedServer measures on adminURL's server instead of a private
	// cluster.
	SharedServer bool
	Logf         func(string, ...any)
}

func (o *MigrationsOptions) defaults() {
	if o.Keys <= 0 {
		o.Keys = 10_000_000
	}
	if o.From <= 0 {
		o.From = 11
	}
	if o.Jobs <= 0 {
		o.Jobs = 1_000_000
	}
	if o.Rate <= 0 {
		o.Rate = 50
	}
	if o.LockSampleInterval <= 0 {
		o.LockSampleInterval = 5 * time.Millisecond
	}
	if o.Before <= 0 {
		o.Before = 20 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// MigrationStep is one migration the run applied.
type MigrationStep struct {
	Name     string        // "River 006" or idemd's version
	Duration time.Duration // as logged
	// Start and End are its window: End the middle of its log line's
	// millisecond, Start Duration before it or the previous step's End.
	Start, End time.Time
	API        APIWindow // the requests and commit gaps overlapping the window
	Locks      StepLocks
}

// APIWindow is the API's figures over one window of the run.
type APIWindow struct {
	Requests      int
	Errors        int
	P50, P99, Max time.Duration // a request's four transactions, from its scheduled start
	LongestStall  time.Duration // the longest gap between two commits
	Length        time.Duration
}

// MigrationsReport is the benchmark's result.
type MigrationsReport struct {
	Server     string
	Keys       int
	Unfinished int // keys unfinished and not given up: what 00012 backfills
	TableSize  string
	Seed       time.Duration
	From       int64 // 0: the article's schema
	Rate       int
	StagedJobs int // staged_jobs rows seeded
	RiverJobs  int // river_job rows seeded
	Steps      []MigrationStep
	// Outside is what the lock sampler saw during the migration but
	// outside every logged step: the advisory lock, the checks and grants
	// of every run, a retry's failed attempt.
	Outside StepLocks
	// BeforeLocks is what it saw in the window before the migration: the
	// API's own lock waits.
	BeforeLocks StepLocks
	// LockSampleInterval is the sampler's; LockSampleGap the longest time
	// between two of its samples during the migration, LockSampleCost the
	// mean time of one sample's query.
	LockSampleInterval, LockSampleGap, LockSampleCost time.Duration

	Migrate     time.Duration // idemctl migrate, process start to exit
	LockRetries int           // its retries after a lock timeout (its log's warnings)
	Before      APIWindow
	During      APIWindow
	// AnchorIndex: on the article's schema, the API's figures while the
	// created_at index that 00002 builds is built again by hand, after
	// the migration (anchorIndex).
	AnchorIndex   APIWindow
	MigrateOutput string

	migStart, migEnd time.Time // idemctl migrate's start and exit
}

// Migrations runs the benchmark once on a private cluster (PostgreSQL's
// defaults), or with SharedServer on adminURL's server.
func Migrations(ctx context.Context, adminURL string, opts MigrationsOptions) (*MigrationsReport, error) {
	opts.defaults()
	rep := &MigrationsReport{Server: "the shared server", Keys: opts.Keys, From: opts.From, Rate: opts.Rate}
	env, err := newBenchEnv(ctx, adminURL, opts.SharedServer, "migrations", opts.Logf)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if env.private {
		rep.Server = "a private cluster (PostgreSQL's defaults: fsync and synchronous_commit on)"
	}
	dbURL, drop, err := scratchdb.Create(ctx, env.adminURL, "idemd_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	defer drop(context.WithoutCancel(ctx)) //nolint:errcheck // a scratch database
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	if opts.Article {
		rep.From = 0
		if err := articleSchema(ctx, dbtest.MigratorURL(dbURL)); err != nil {
			return nil, err
		}
	} else if err := olderSchema(ctx, dbtest.MigratorURL(dbURL), opts.From); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: pool: %w", err)
	}
	defer pool.Close()
	start := time.Now()
	rep.StagedJobs = opts.Jobs
	if !opts.Article {
		rep.RiverJobs = opts.Jobs
	}
	if err := seedKeys(ctx, pool, opts.Keys, rep.StagedJobs, rep.RiverJobs, opts.Article, opts.Logf); err != nil {
		return nil, err
	}
	rep.Seed = time.Since(start)
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE recovery_point <> 'finished'),
		pg_size_pretty(pg_total_relation_size('idempotency_keys')) FROM idempotency_keys`).Scan(&rep.Unfinished, &rep.TableSize); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	opts.Logf("migrations: seeded %d keys (%d unfinished, %s with indexes) in %s", opts.Keys, rep.Unfinished, rep.TableSize, rep.Seed.Round(time.Second))

	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	cfg.MaxConns = 32
	cfg.ConnConfig.RuntimeParams["application_name"] = apiAppName
	api, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrations: pool: %w", err)
	}
	defer api.Close()
	ld := &apiLoad{pool: api, rate: opts.Rate}
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); ld.run(loadCtx) }()
	defer func() { stopLoad(); <-loadDone }()

	// A few seconds of load not measured: connections, caches.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(3 * time.Second):
	}
	samplerConn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: lock sampler: %w", err)
	}
	defer samplerConn.Close(context.WithoutCancel(ctx)) // a scratch database
	sampler := &lockSampler{interval: opts.LockSampleInterval}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan error, 1)
	go func() { sampled <- sampler.run(sampleCtx, samplerConn) }()
	stopSampler := sync.OnceValue(func() error { stopSampling(); return <-sampled })
	defer stopSampler() //nolint:errcheck // on an early return

	beforeStart := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(opts.Before):
	}

	migratorURL, err := withParam(dbtest.MigratorURL(dbURL), "application_name", migratorAppName)
	if err != nil {
		return nil, err
	}
	migStart := time.Now()
	out, err := runMigrate(ctx, env.bins.Idemctl, migratorURL, filepath.Join(env.dir, "migrate.log"))
	migEnd := time.Now()
	rep.MigrateOutput = out
	rep.Migrate = migEnd.Sub(migStart)
	rep.migStart, rep.migEnd = migStart, migEnd
	if err != nil {
		return nil, err
	}
	opts.Logf("migrations: idemctl migrate took %s", rep.Migrate.Round(time.Millisecond))
	if err := stopSampler(); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	if opts.Article {
		if rep.AnchorIndex, err = anchorIndex(ctx, dbtest.MigratorURL(dbURL), ld, opts.Logf); err != nil {
			return nil, err
		}
	}
	stopLoad()
	<-loadDone

	names, err := sampler.resolveNames(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	rep.Steps = migrationSteps(out)
	rep.LockRetries = strings.Count(out, "lock was not granted in time")
	rep.Before = ld.window(beforeStart, migStart)
	rep.During = ld.window(migStart, migEnd)
	var windows [][2]time.Time
	for i := range rep.Steps {
		s := &rep.Steps[i]
		s.API = ld.overlapping(s.Start, s.End)
		s.Locks = sampler.stepLocks(s.Start, s.End, names)
		windows = append(windows, [2]time.Time{s.Start, s.End})
	}
	rep.Outside = sampler.outsideLocks(migStart, migEnd, windows, names)
	rep.BeforeLocks = sampler.stepLocks(beforeStart, migStart, names)
	rep.LockSampleInterval = opts.LockSampleInterval
	rep.LockSampleGap = sampler.longestGap(migStart, migEnd)
	if n := len(sampler.samples); n > 0 {
		rep.LockSampleCost = sampler.spent / time.Duration(n)
	}
	return rep, nil
}

// anchorIndex is what PostgreSQL's own index build costs the API, beside
// 00002's on the article's schema: after a few seconds of the load alone,
// the same index, on idempotency_keys (created_at), built CONCURRENTLY by
// hand (not by idemctl, with the server's settings) while the load runs,
// then dropped. Its API window is the build's.
func anchorIndex(ctx context.Context, migratorURL string, ld *apiLoad, logf func(string, ...any)) (w APIWindow, err error) {
	conn, err := pgx.Connect(ctx, migratorURL)
	if err != nil {
		return w, fmt.Errorf("migrations: anchor index: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // a scratch database
	select {
	case <-ctx.Done():
		return w, ctx.Err()
	case <-time.After(5 * time.Second):
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, `CREATE INDEX CONCURRENTLY idemd_bench_anchor ON idempotency_keys (created_at)`); err != nil {
		return w, fmt.Errorf("migrations: anchor index: %w", err)
	}
	end := time.Now()
	if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY idemd_bench_anchor`); err != nil {
		return w, fmt.Errorf("migrations: anchor index: drop: %w", err)
	}
	w = ld.window(start, end)
	logf("migrations: the same index by hand took %s; API p99 %s", end.Sub(start).Round(time.Millisecond), w.P99)
	return w, nil
}

// olderSchema applies every River migration and idemd's up to from, as the
// migrator role, as an older release's `idemctl migrate` left them, with
// the completer's index that 00002 created in those releases.
func olderSchema(ctx context.Context, migratorURL string, from int64) error {
	pool, err := pgxpool.New(ctx, migratorURL)
	if err != nil {
		return fmt.Errorf("migrations: pool: %w", err)
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("migrations: river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrations: river: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrate.Files(),
		goose.WithTableName(migrate.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrations: goose: %w", err)
	}
	if _, err := provider.UpTo(ctx, from); err != nil {
		return fmt.Errorf("migrations: up to %d: %w", from, err)
	}
	return nil
}

// articleSchema creates the article's tables, as the migrator role, which
// owns them as it would after handing them over (docs/operations.md).
func articleSchema(ctx context.Context, migratorURL string) error {
	conn, err := pgx.Connect(ctx, migratorURL)
	if err != nil {
		return fmt.Errorf("migrations: article schema: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // a scratch database
	if _, err := conn.Exec(ctx, migrations.ArticleSchema+`
CREATE TABLE staged_jobs (id BIGSERIAL PRIMARY KEY, job_name TEXT NOT NULL, job_args JSONB NOT NULL);
INSERT INTO users (email) SELECT 'u' || g || '@example.com' FROM generate_series(1, 100000) g;`); err != nil {
		return fmt.Errorf("migrations: article schema: %w", err)
	}
	return nil
}

// The seed's mix, by id modulo 200: 0-2 unfinished at each recovery point
// the API stops at (1.5 %), 3 given up by the completer (0.5 %), the rest
// finished, over the last 30 days. Sizes are a ride's: request_params
// about 200 bytes of JSON, response_body about 300.
// The article's schema has no completer columns (seedArticleSQL): its
// given-up share is unfinished.
const seedSQL = `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
    request_path, response_code, response_body, recovery_point, user_id` + seedCompleterColumns + `)
SELECT ts, 'seed-' || md5(g::text), ts, CASE WHEN b < 4 THEN ts END, 'POST',
       jsonb_build_object('origin_lat', 37.0 + (g % 1000) / 1000.0, 'origin_lon', -122.0 - (g % 997) / 1000.0,
                          'target_lat', 37.5 + (g % 991) / 1000.0, 'target_lon', -122.5 - (g % 983) / 1000.0,
                          'note', repeat('r', (60 + g % 40)::int)),
       '/rides',
       CASE WHEN b >= 4 THEN 201 END,
       CASE WHEN b >= 4 THEN '{"ride":{"id":' || g || ',"origin_lat":37.1,"origin_lon":-122.1,"target_lat":37.6,"target_lon":-122.6,' ||
            '"stripe_charge_id":"ch_' || md5(g::text) || '","user_id":' || (g % 100000) || '},"receipt":"' || repeat('x', (120 + g % 60)::int) || '"}' END /*body*/,
       CASE b WHEN 0 THEN 'started' WHEN 1 THEN 'ride_created' WHEN 2 THEN 'charge_created' WHEN 3 THEN 'charge_created' ELSE 'finished' END,
       1 + g % 100000` + seedCompleterValues + `
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / $3::float8) AS ts, (g % 200)::int AS b) x`

const (
	seedCompleterColumns = `, completer_attempts, completer_gave_up_at`
	seedCompleterValues  = `,
       CASE WHEN b = 3 THEN 5 ELSE 0 END,
       CASE WHEN b = 3 THEN ts + interval '1 hour' END`
)

// seedArticleSQL is seedSQL for the article's schema: no completer
// columns, response_body JSONB.
var seedArticleSQL = strings.NewReplacer(seedCompleterColumns, "", seedCompleterValues, "", "/*body*/", "::jsonb").Replace(seedSQL)

// seedRiverJobSQL is river_job's seed: the receipts River ran, over the
// same 30 days as the keys, the newest 5 % still available (no River client
// runs here), args of about 100 bytes.
const seedRiverJobSQL = `
INSERT INTO river_job (state, attempt, max_attempts, attempted_at, attempted_by, created_at, finalized_at, scheduled_at,
    priority, args, kind, metadata, queue, tags)
SELECT CASE WHEN avail THEN 'available' ELSE 'completed' END::river_job_state,
       CASE WHEN avail THEN 0 ELSE 1 END, 25,
       CASE WHEN NOT avail THEN ts + interval '40 milliseconds' END,
       CASE WHEN NOT avail THEN ARRAY['worker-' || (g % 4)] END,
       ts, CASE WHEN NOT avail THEN ts + interval '90 milliseconds' END, ts, 1,
       jsonb_build_object('key_id', g, 'ride_id', g, 'email', 'rider' || (g % 100000) || '@example.com',
                          'note', repeat('r', (20 + g % 20)::int)),
       'send_ride_receipt', '{}', 'default', '{}'
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / $3::float8) AS ts, g > $3 - $3 / 20 AS avail) x`

// seedStagedSQL is staged_jobs' seed: receipts staged over the same 30
// days and never enqueued, job_args of about 80 bytes. The article's
// staged_jobs has no created_at.
func seedStagedSQL(article bool) string {
	created := ", created_at"
	if article {
		created = ""
	}
	return `
INSERT INTO staged_jobs (job_name, job_args` + created + `)
SELECT 'send_ride_receipt', jsonb_build_object('key_id', g, 'note', repeat('s', (40 + g % 20)::int))` + created + `
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / $3::float8) AS created_at) x`
}

// seedKeys inserts n keys in batches, with the secondary indexes dropped
// and rebuilt after (as a restore would), the completer's index of older
// releases among them, then staged and River jobs the same way, then
// vacuums and analyses the tables so that autovacuum does not run during
// the measurement.
func seedKeys(ctx context.Context, pool *pgxpool.Pool, n, staged, riverJobs int, article bool, logf func(string, ...any)) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations: seed: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '512MB'; SET synchronous_commit = off;
DROP INDEX IF EXISTS idempotency_keys_user_id_idempotency_key; DROP INDEX IF EXISTS idempotency_keys_created_at`); err != nil {
		return fmt.Errorf("migrations: seed: %w", err)
	}
	if err := seedBatches(ctx, conn.Conn(), "keys", map[bool]string{false: seedSQL, true: seedArticleSQL}[article], n, logf); err != nil {
		return err
	}
	ddls := []string{
		`CREATE UNIQUE INDEX idempotency_keys_user_id_idempotency_key ON idempotency_keys (user_id, idempotency_key)`,
		`CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at)`,
		`CREATE INDEX idempotency_keys_unfinished ON idempotency_keys (created_at) WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`,
	}
	if article {
		// The article's only index besides the primary key.
		ddls = ddls[:1]
	}
	for _, ddl := range ddls {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("migrations: seed: %s: %w", ddl, err)
		}
		logf("migrations: seed: %s", ddl)
	}
	ddls = []string{`VACUUM (FREEZE, ANALYZE) idempotency_keys`}
	jobs := []struct {
		table, sql string
		n          int
	}{{"staged_jobs", seedStagedSQL(article), staged}, {"river_job", seedRiverJobSQL, riverJobs}}
	for _, j := range jobs {
		if j.n == 0 {
			continue
		}
		if err := withoutIndexes(ctx, conn.Conn(), j.table, logf, func() error {
			return seedBatches(ctx, conn.Conn(), j.table+" rows", j.sql, j.n, logf)
		}); err != nil {
			return err
		}
		ddls = append(ddls, `VACUUM (FREEZE, ANALYZE) `+j.table)
	}
	for _, ddl := range append(ddls, `CHECKPOINT`) {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("migrations: seed: %s: %w", ddl, err)
		}
		logf("migrations: seed: %s", ddl)
	}
	return nil
}

// seedBatches runs a seed statement over 1..n in batches: its parameters
// are a batch's first and last number and n.
func seedBatches(ctx context.Context, conn *pgx.Conn, what, sql string, n int, logf func(string, ...any)) error {
	const batch = 500_000
	for lo := 1; lo <= n; lo += batch {
		hi := min(lo+batch-1, n)
		if _, err := conn.Exec(ctx, sql, lo, hi, n); err != nil {
			return fmt.Errorf("migrations: seed %s %d-%d: %w", what, lo, hi, err)
		}
		logf("migrations: seeded %d of %d %s", hi, n, what)
	}
	return nil
}

// withoutIndexes runs seed with table's indexes that back no constraint
// dropped, and builds them again after from their definitions, as a
// restore would.
func withoutIndexes(ctx context.Context, conn *pgx.Conn, table string, logf func(string, ...any), seed func() error) error {
	rows, err := conn.Query(ctx, `
SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::regclass AND NOT EXISTS (SELECT FROM pg_constraint WHERE conindid = i.indexrelid)
ORDER BY c.relname`, table)
	if err != nil {
		return fmt.Errorf("migrations: seed %s: indexes: %w", table, err)
	}
	type index struct{ name, def string }
	indexes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (index, error) {
		var ix index
		return ix, r.Scan(&ix.name, &ix.def)
	})
	if err != nil {
		return fmt.Errorf("migrations: seed %s: indexes: %w", table, err)
	}
	for _, ix := range indexes {
		if _, err := conn.Exec(ctx, `DROP INDEX `+pgx.Identifier{ix.name}.Sanitize()); err != nil {
			return fmt.Errorf("migrations: seed %s: drop %s: %w", table, ix.name, err)
		}
	}
	if err := seed(); err != nil {
		return err
	}
	for _, ix := range indexes {
		if _, err := conn.Exec(ctx, ix.def); err != nil {
			return fmt.Errorf("migrations: seed %s: %s: %w", table, ix.def, err)
		}
		logf("migrations: seed: %s", ix.def)
	}
	return nil
}

// runMigrate runs `idemctl migrate` at its defaults and returns its output
// (also written to logPath).
func runMigrate(ctx context.Context, bin, dbURL, logPath string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "migrate", "--database-url", dbURL, "--log-format", "json")
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return string(out), fmt.Errorf("migrations: idemctl migrate: %w\n%s", err, out)
	}
	return string(out), nil
}

// migrationSteps reads each applied migration's duration and window from
// idemctl's JSON log: River's "Applied migration" lines and goose's
// "migration completed" ones, each written as its migration ends.
func migrationSteps(out string) []MigrationStep {
	var steps []MigrationStep
	for _, line := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		var step MigrationStep
		switch {
		case strings.HasSuffix(msg, "Applied migration"):
			v, _ := m["version"].(float64)
			step = MigrationStep{Name: fmt.Sprintf("River %03d", int(v)), Duration: logDuration(m["duration"], time.Nanosecond)}
		case msg == "migration completed":
			src, _ := m["source"].(string)
			step = MigrationStep{Name: "idemd " + strings.TrimSuffix(src, ".sql"), Duration: logDuration(m["duration_seconds"], time.Second)}
		default:
			continue
		}
		// The log's time is to the millisecond, truncated: the step
		// ended within the millisecond after it, taken as its middle. A
		// step starts after the one before it ended: windows do not
		// overlap, and a sample within half a millisecond of a boundary
		// may be given to the neighbouring step.
		ts, _ := m["ts"].(string)
		if end, err := time.Parse(logTimeLayout, ts); err == nil {
			step.End = end.Add(time.Millisecond / 2)
			step.Start = step.End.Add(-step.Duration)
			if n := len(steps); n > 0 && step.Start.Before(steps[n-1].End) {
				step.Start = steps[n-1].End
				if step.End.Before(step.Start) {
					step.End = step.Start
				}
			}
		}
		steps = append(steps, step)
	}
	return steps
}

// logTimeLayout is idemctl's JSON log's time (internal/logging: zap's
// ISO 8601 encoder).
const logTimeLayout = "2006-01-02T15:04:05.000Z0700"

// logDuration reads a logged duration: a string ("1.5s"), or a number of
// unit.
func logDuration(v any, unit time.Duration) time.Duration {
	switch d := v.(type) {
	case string:
		p, _ := time.ParseDuration(d)
		return p
	case float64:
		return time.Duration(d * float64(unit))
	}
	return 0
}

// apiLoad is the API: Rate requests a second, each started on schedule
// whatever the previous ones are doing.
type apiLoad struct {
	pool *pgxpool.Pool
	rate int

	mu       sync.Mutex
	requests []apiRequest
	commits  []time.Time
}

type apiRequest struct {
	scheduled, done time.Time
	err             error
}

func (l *apiLoad) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	interval := time.Second / time.Duration(l.rate)
	next := time.Now()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		wg.Add(1)
		go func(n int, scheduled time.Time) {
			defer wg.Done()
			err := l.request(ctx, n)
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			l.requests = append(l.requests, apiRequest{scheduled: scheduled, done: time.Now(), err: err})
			l.mu.Unlock()
		}(n, next)
		next = next.Add(interval)
	}
}

// request is one ride: the key's insert, then the phases, each its own
// transaction as the API's atomic phases are.
func (l *apiLoad) request(ctx context.Context, n int) error {
	key := "live-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(n)
	user := 1 + n%100000
	var id int64
	phases := []func(pgx.Tx) error{
		func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `INSERT INTO idempotency_keys (idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
VALUES ($1, now(), 'POST', $2, '/rides', 'started', $3) RETURNING id`, key,
				`{"origin_lat":37.1,"origin_lon":-122.1,"target_lat":37.6,"target_lon":-122.6,"note":"a ride"}`, user).Scan(&id)
		},
		func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'ride_created', last_run_at = now() WHERE id = $1`, id)
			return err
		},
		func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'charge_created', last_run_at = now() WHERE id = $1`, id)
			return err
		},
		func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', jsonb_build_object('key_id', $1::bigint))`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'finished', locked_at = NULL, response_code = 201,
response_body = $2 WHERE id = $1`, id, `{"ride":{"id":1,"origin_lat":37.1,"origin_lon":-122.1},"receipt":"sent"}`)
			return err
		},
	}
	for _, ph := range phases {
		if err := pgx.BeginFunc(ctx, l.pool, ph); err != nil {
			return err
		}
		l.mu.Lock()
		l.commits = append(l.commits, time.Now())
		l.mu.Unlock()
	}
	return nil
}

// overlapping is the figures of the requests that overlap [from, to] (from
// their scheduled start to their end) and, as the longest stall, the longest
// gap between two consecutive commits that overlaps it.
func (l *apiLoad) overlapping(from, to time.Time) APIWindow {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.latencies(from, to, func(r apiRequest) bool { return r.scheduled.Before(to) && !r.done.Before(from) })
	commits := l.sortedCommits()
	for i := 1; i < len(commits); i++ {
		if commits[i-1].Before(to) && commits[i].After(from) {
			w.LongestStall = max(w.LongestStall, commits[i].Sub(commits[i-1]))
		}
	}
	return w
}

// latencies is the window [from, to)'s figures but its stall: the requests
// keep selects, their count, errors and latency percentiles. l.mu is held.
func (l *apiLoad) latencies(from, to time.Time, keep func(apiRequest) bool) APIWindow {
	w := APIWindow{Length: to.Sub(from)}
	var lat []time.Duration
	for _, r := range l.requests {
		if !keep(r) {
			continue
		}
		w.Requests++
		if r.err != nil {
			w.Errors++
			continue
		}
		lat = append(lat, r.done.Sub(r.scheduled))
	}
	slices.Sort(lat)
	w.P50, w.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	if len(lat) > 0 {
		w.Max = lat[len(lat)-1]
	}
	return w
}

// sortedCommits is the commits' times in order. l.mu is held.
func (l *apiLoad) sortedCommits() []time.Time {
	commits := slices.Clone(l.commits)
	slices.SortFunc(commits, func(a, b time.Time) int { return a.Compare(b) })
	return commits
}

// window is the figures of the requests scheduled in [from, to) and the
// commits in it.
func (l *apiLoad) window(from, to time.Time) APIWindow {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.latencies(from, to, func(r apiRequest) bool { return !r.scheduled.Before(from) && r.scheduled.Before(to) })
	commits := l.sortedCommits()
	prev := from
	for _, c := range commits {
		if c.Before(from) {
			continue
		}
		if c.After(to) {
			break
		}
		w.LongestStall = max(w.LongestStall, c.Sub(prev))
		prev = c
	}
	w.LongestStall = max(w.LongestStall, to.Sub(prev))
	return w
}

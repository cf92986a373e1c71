package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// The staging-throughput phase: what staging a job costs an API that
// commits thousands of them a second. Closed-loop clients run a ride-like
// transaction (insert a ride, stage its receipt job, commit) straight
// against the database, with no HTTP in between, in three variants:
//
//	staging + idemd: INSERT INTO staged_jobs with idemd's trigger, two
//	    enqueuers (real processes at their defaults) moving the rows;
//	staging, no idemd objects: the same INSERT into a twin table without
//	    the trigger, nothing moving it (the anchor);
//	River InsertTx: the same job inserted with River's InsertTx in the
//	    transaction (a Go API without idemd).
//
// Each reports commits/s and the commit's p99 (BEGIN to COMMIT's answer);
// the idemd variant also the time from each commit's answer to its River
// job's created_at (set when the enqueuer inserts it), p50 and p99.

// Staging variants.
const (
	StagingIdemd = "staging + idemd (2 enqueuers)"
	// StagingIdemdOwnCPU is StagingIdemd with the enqueuer processes at
	// nice -10: in production they run on CPUs of their own (their pods'),
	// not on the cores the database's backends saturate here, and this is
	// the closest these shared cores come to it. The database's backend of
	// the move still competes with the API's backends, as it would on a
	// busy database server.
	StagingIdemdOwnCPU = "staging + idemd (2 enqueuers at nice -10)"
	StagingPlain       = "staging, no idemd objects"
	StagingRiver       = "River InsertTx"
	// StagingPolled is the idemd variant's commit path alone: the trigger
	// finds the polling lock held (by the benchmark), as under a stream of
	// commits, and no enqueuer moves the rows. Against StagingPlain it is
	// what the trigger costs the API; against StagingIdemd, what moving
	// the rows costs a machine the database and the enqueuers share.
	StagingPolled = "staging + idemd trigger, polled, nothing moving"
	// StagingFloor is the least any mover into River costs the machine:
	// the transaction without idemd's objects while a goroutine of the
	// benchmark copies each committed row into River (InsertManyFast,
	// up to 1,000 rows every 3 ms), deleting nothing. Against StagingPlain
	// it is what getting the jobs into River at all costs on these cores;
	// against StagingIdemd, what idemd's hop adds to that.
	StagingFloor = "staging, no idemd objects, copied into River beside"
)

// StagingVariants lists them in report order.
var StagingVariants = []string{StagingIdemd, StagingPlain, StagingRiver, StagingPolled, StagingFloor, StagingIdemdOwnCPU}

// moves reports whether variant runs enqueuers, whose commits are followed
// into River.
func moves(variant string) bool { return variant == StagingIdemd || variant == StagingIdemdOwnCPU }

// ownCPUNice is StagingIdemdOwnCPU's niceness.
const ownCPUNice = -10

// StagingOptions tunes the phase; zero values take the defaults.
type StagingOptions struct {
	Clients []int         // default 8, 32, 64
	Length  time.Duration // of each run, warm-up included (default 8 s)
	Warmup  time.Duration // not measured (default 1 s)
	// Rounds: each (variant, clients) runs this many times, the variants
	// in an order that changes from round to round; runs are pooled
	// (default 2).
	Rounds int
	// Variants, when set, runs only these of StagingVariants (a focused
	// look at one of them); the report's ratios need all four.
	Variants []string
	// SharedServer, EnqueuerArgs: as LoadOptions' and Config's.
	SharedServer bool
	EnqueuerArgs []string
	Logf         func(string, ...any)
}

func (o *StagingOptions) defaults() {
	if len(o.Clients) == 0 {
		o.Clients = []int{8, 32, 64}
	}
	if o.Length <= 0 {
		o.Length = 8 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = min(time.Second, o.Length/4)
	}
	if o.Rounds <= 0 {
		o.Rounds = 2
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// StagingPhase is one variant at one client count, its runs pooled.
type StagingPhase struct {
	Variant string
	Clients int
	Runs    int
	Commits int           // measured commits
	Elapsed time.Duration // measured time, summed over runs
	// CommitP50 and CommitP99: BEGIN to COMMIT's answer.
	CommitP50, CommitP99 time.Duration
	// ToRiverP50 and ToRiverP99: a commit's answer to its River job's
	// created_at (the idemd variant; 0 otherwise).
	ToRiverP50, ToRiverP99 time.Duration
	// Copied: the rows StagingFloor's mover put into River.
	Copied int
	// PerRun is each run's commits/s, in round order.
	PerRun []float64

	commits, toRiver []time.Duration
}

// CommitsPerSecond is the phase's throughput.
func (p StagingPhase) CommitsPerSecond() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Commits) / p.Elapsed.Seconds()
}

// StagingReport is the phase's result.
type StagingReport struct {
	Server string
	Phases []StagingPhase // by clients, then StagingVariants' order
	// IdleTransactionsPerSecond: transactions a second two enqueuers ran
	// against a database where nothing was ever staged (pg_stat_database's
	// committed and rolled-back transactions of that database over a
	// quiet window), after the runs.
	IdleTransactionsPerSecond float64
}

// Find returns the phase of variant at clients.
func (r *StagingReport) Find(variant string, clients int) (StagingPhase, bool) {
	for _, p := range r.Phases {
		if p.Variant == variant && p.Clients == clients {
			return p, true
		}
	}
	return StagingPhase{}, false
}

// Staging runs the phase on a private cluster (PostgreSQL's defaults, fsync
// and synchronous_commit on), or with SharedServer on adminURL's server,
// each run in a fresh database.
func Staging(ctx context.Context, adminURL string, opts StagingOptions) (*StagingReport, error) {
	opts.defaults()
	rep := &StagingReport{Server: "the shared server"}
	env, err := newBenchEnv(ctx, adminURL, opts.SharedServer, "staging", opts.Logf)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if env.private {
		rep.Server = "a private cluster (PostgreSQL's defaults: fsync and synchronous_commit on)"
	}
	s := &staging{adminURL: env.adminURL, bins: env.bins, dir: env.dir, opts: opts}
	for _, clients := range opts.Clients {
		pooled := make([]StagingPhase, len(StagingVariants))
		for round := range opts.Rounds {
			for _, i := range roundOrder(len(StagingVariants), round+clients) {
				if len(opts.Variants) > 0 && !slices.Contains(opts.Variants, StagingVariants[i]) {
					continue
				}
				ph, err := s.run(ctx, StagingVariants[i], clients)
				if err != nil {
					return nil, err
				}
				pooled[i] = mergeStaging(pooled[i], ph)
			}
		}
		rep.Phases = append(rep.Phases, pooled...)
	}
	if len(opts.Variants) == 0 || slices.Contains(opts.Variants, StagingIdemd) {
		if rep.IdleTransactionsPerSecond, err = s.idle(ctx); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

type staging struct {
	adminURL string
	bins     *system.Binaries
	dir      string
	opts     StagingOptions
}

// stagingSchema is the ride table every variant writes, and the twin of
// staged_jobs without idemd's trigger (its own id sequence, as an API's
// table would have).
const stagingSchema = `
CREATE TABLE bench_rides (id bigserial PRIMARY KEY, user_id bigint NOT NULL, origin float8, target float8, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_staged_plain (LIKE staged_jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES);
CREATE SEQUENCE bench_staged_plain_id_seq OWNED BY bench_staged_plain.id;
ALTER TABLE bench_staged_plain ALTER id SET DEFAULT nextval('bench_staged_plain_id_seq')`

// receiptArgs is the River variant's job.
type receiptArgs struct {
	RideID int64 `json:"ride_id"`
}

func (receiptArgs) Kind() string { return "send_ride_receipt" }

// database makes a fresh database with the benchmark's tables and a pool
// of clients connections on it; done drops both.
func (s *staging) database(ctx context.Context, clients int) (dbURL string, pool *pgxpool.Pool, done func(context.Context) error, err error) {
	dbURL, drop, err := system.CreateDatabase(ctx, s.adminURL, s.bins, "idemd_staging")
	if err != nil {
		return "", nil, nil, fmt.Errorf("staging: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err == nil {
		cfg.MaxConns = int32(clients)
		pool, err = pgxpool.NewWithConfig(ctx, cfg)
	}
	if err == nil {
		_, err = pool.Exec(ctx, stagingSchema)
	}
	done = func(ctx context.Context) error {
		if pool != nil {
			pool.Close()
		}
		return drop(ctx)
	}
	if err != nil {
		return "", nil, nil, errors.Join(fmt.Errorf("staging: database: %w", err), done(context.WithoutCancel(ctx)))
	}
	return dbURL, pool, done, nil
}

// enqueuers starts two enqueuers on dbURL at niceness nice and waits for
// them to be ready; the caller closes them.
func (s *staging) enqueuers(ctx context.Context, dbURL string, nice int) ([]*system.Proc, error) {
	var procs []*system.Proc
	for i := range 2 {
		addr, err := system.FreeAddr()
		if err != nil {
			return procs, fmt.Errorf("staging: %w", err)
		}
		args := append([]string{"--database-url", dbtest.RuntimeURL(dbURL), "--log-format", "console", "--log-level", "warn", "--http-addr", addr}, s.opts.EnqueuerArgs...)
		p := &system.Proc{Name: fmt.Sprintf("enqueuer-%d", i+1), Bin: s.bins.Enqueuer, Args: args, OpsAddr: addr, LogPath: filepath.Join(s.dir, fmt.Sprintf("enqueuer-%d.log", i+1))}
		if nice != 0 {
			// nice(1) sets it before the exec, so every thread of the
			// process has it; it only warns when it may not.
			p.Bin, p.Args = "nice", append([]string{"-n", strconv.Itoa(nice), s.bins.Enqueuer}, args...)
		}
		if err := p.Start(); err != nil {
			return procs, fmt.Errorf("staging: %w", err)
		}
		procs = append(procs, p)
		if err := system.WaitReady(ctx, p); err != nil {
			return procs, err
		}
		// Ready: nice has set the niceness and executed the enqueuer.
		if err := checkNice(p.Pid(), nice); err != nil {
			return procs, err
		}
	}
	return procs, nil
}

// run measures variant at clients once, in a fresh database.
func (s *staging) run(ctx context.Context, variant string, clients int) (ph StagingPhase, err error) {
	ph.Variant, ph.Clients, ph.Runs = variant, clients, 1
	dbURL, pool, done, err := s.database(ctx, clients)
	if err != nil {
		return ph, err
	}
	defer func() {
		if derr := done(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = fmt.Errorf("staging: %w", derr)
		}
	}()
	var procs []*system.Proc
	if moves(variant) {
		nice := 0
		if variant == StagingIdemdOwnCPU {
			nice = ownCPUNice
		}
		procs, err = s.enqueuers(ctx, dbURL, nice)
		for _, p := range procs {
			defer p.Close()
		}
		if err != nil {
			return ph, err
		}
	}
	if variant == StagingPolled {
		// The drainer's polling lock (internal/enqueuer, poll.go), held
		// for the run on a session of its own.
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return ph, fmt.Errorf("staging: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // ends the lock's session
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock((x'1d3e0001'::bigint << 32) | 'staged_jobs'::regclass::oid::bigint)`); err != nil {
			return ph, fmt.Errorf("staging: polling lock: %w", err)
		}
	}
	var rc *river.Client[pgx.Tx]
	if variant == StagingRiver || variant == StagingFloor {
		if rc, err = river.NewClient(riverpgxv5.New(pool), &river.Config{}); err != nil {
			return ph, fmt.Errorf("staging: river client: %w", err)
		}
	}
	if variant == StagingFloor {
		stop := s.copyIntoRiver(ctx, pool, rc)
		defer func() {
			var cerr error
			if ph.Copied, cerr = stop(); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	stage := func(ctx context.Context, tx pgx.Tx, rideID int64) (int64, error) {
		var id int64
		switch variant {
		case StagingIdemd, StagingIdemdOwnCPU, StagingPolled:
			err := tx.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', jsonb_build_object('ride_id', $1::bigint)) RETURNING id`, rideID).Scan(&id)
			return id, err
		case StagingPlain, StagingFloor:
			err := tx.QueryRow(ctx, `INSERT INTO bench_staged_plain (job_name, job_args) VALUES ('send_ride_receipt', jsonb_build_object('ride_id', $1::bigint)) RETURNING id`, rideID).Scan(&id)
			return id, err
		default:
			_, err := rc.InsertTx(ctx, tx, receiptArgs{RideID: rideID}, nil)
			return 0, err
		}
	}

	s.opts.Logf("staging: %s, %d clients, %s (%s warm-up)", variant, clients, s.opts.Length, s.opts.Warmup)
	type commit = struct {
		id int64
		at time.Time
	}
	var (
		mu       sync.Mutex
		lats     []time.Duration
		commits  []commit
		firstErr error
	)
	start := time.Now()
	measureFrom, end := start.Add(s.opts.Warmup), start.Add(s.opts.Length)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			var myLats []time.Duration
			var mine []commit
			for time.Now().Before(end) {
				began := time.Now()
				var staged int64
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var ride int64
					if err := tx.QueryRow(ctx, `INSERT INTO bench_rides (user_id, origin, target) VALUES ($1, random(), random()) RETURNING id`, c).Scan(&ride); err != nil {
						return err
					}
					var err error
					staged, err = stage(ctx, tx, ride)
					return err
				})
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				at := time.Now()
				if began.After(measureFrom) && at.Before(end) {
					myLats = append(myLats, at.Sub(began))
					if moves(variant) {
						mine = append(mine, commit{staged, at})
					}
				}
			}
			mu.Lock()
			lats = append(lats, myLats...)
			commits = append(commits, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return ph, fmt.Errorf("staging: %s: %w", variant, firstErr)
	}
	ph.Elapsed = end.Sub(measureFrom)
	ph.Commits = len(lats)
	slices.Sort(lats)
	ph.commits = lats
	ph.CommitP50, ph.CommitP99 = percentile(lats, 0.50), percentile(lats, 0.99)
	ph.PerRun = []float64{ph.CommitsPerSecond()}

	if moves(variant) {
		if err := s.settle(ctx, pool, procs); err != nil {
			return ph, err
		}
		if ph.toRiver, err = toRiver(ctx, pool, commits, start, s.opts.Logf); err != nil {
			return ph, err
		}
		ph.ToRiverP50, ph.ToRiverP99 = percentile(ph.toRiver, 0.50), percentile(ph.toRiver, 0.99)
	}
	s.opts.Logf("staging: %s, %d clients: %.0f commits/s, commit p99 %s, to River p50 %s p99 %s",
		variant, clients, ph.CommitsPerSecond(), ph.CommitP99, ph.ToRiverP50, ph.ToRiverP99)
	return ph, nil
}

// settle waits for the enqueuers to move every staged row and checks they
// are still running.
func (s *staging) settle(ctx context.Context, pool *pgxpool.Pool, procs []*system.Proc) error {
	err := system.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		var left int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&left)
		return left == 0, err
	})
	if err != nil {
		return fmt.Errorf("staging: waiting for the enqueuers: %w", err)
	}
	for _, p := range procs {
		if _, _, unexpected := p.Counts(); len(unexpected) > 0 {
			return fmt.Errorf("staging: %s exited during the run: %v\n%s", p.Name, unexpected, p.LogTail(2000))
		}
	}
	return nil
}

// checkNice fails unless every thread of process pid runs at niceness want
// (a variant measured at the wrong priority would say nothing).
func checkNice(pid, want int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("staging: niceness: %w", err)
	}
	for _, t := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			return fmt.Errorf("staging: niceness: %w", err)
		}
		// The fields after the command's closing parenthesis: state is
		// the first, niceness the 17th.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 17 || f[16] != strconv.Itoa(want) {
			return fmt.Errorf("staging: enqueuer thread %s runs at niceness %v, want %d (a negative niceness needs root or CAP_SYS_NICE)", t.Name(), f[min(16, len(f)-1)], want)
		}
	}
	return nil
}

// idle measures two enqueuers' cost on a database where nothing was ever
// staged: their sweeps, gauges and self-checks alone, with no autovacuum of
// a run's tables in the window.
func (s *staging) idle(ctx context.Context) (tps float64, err error) {
	dbURL, pool, done, err := s.database(ctx, 1)
	if err != nil {
		return 0, err
	}
	defer func() {
		if derr := done(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = fmt.Errorf("staging: %w", derr)
		}
	}()
	procs, err := s.enqueuers(ctx, dbURL, 0)
	for _, p := range procs {
		defer p.Close()
	}
	if err != nil {
		return 0, err
	}
	tps, err = idleTransactions(ctx, pool)
	s.opts.Logf("staging: two idle enqueuers: %.2f transactions a second", tps)
	return tps, err
}

// copyIntoRiver is StagingFloor's mover: every 3 ms it copies the rows
// committed into bench_staged_plain since its last copy into River, up to
// 1,000 at a time, until stop. A row whose id was handed out before the
// last copied one but committed after it is skipped: this is a measure of
// the machine's cost of River's inserts, not a mover.
func (s *staging) copyIntoRiver(ctx context.Context, pool *pgxpool.Pool, rc *river.Client[pgx.Tx]) (stop func() (int, error)) {
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	copied := 0
	go func() {
		var last int64
		t := time.NewTicker(3 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				errc <- nil
				return
			case <-t.C:
			}
			rows, err := pool.Query(ctx, `SELECT id, job_args FROM bench_staged_plain WHERE id > $1 ORDER BY id LIMIT 1000`, last)
			var params []river.InsertManyParams
			if err == nil {
				var id int64
				var args []byte
				_, err = pgx.ForEachRow(rows, []any{&id, &args}, func() error {
					last = id
					params = append(params, river.InsertManyParams{Args: rawReceipt(slices.Clone(args))})
					return nil
				})
			}
			if err == nil && len(params) > 0 {
				var n int
				n, err = rc.InsertManyFast(ctx, params)
				copied += n
			}
			if err != nil {
				if ctx.Err() != nil {
					errc <- nil
				} else {
					errc <- fmt.Errorf("staging: copy into River: %w", err)
				}
				return
			}
		}
	}()
	return func() (int, error) { cancel(); err := <-errc; return copied, err }
}

// rawReceipt is a staged receipt job's args, as the copy hands them to
// River.
type rawReceipt []byte

func (rawReceipt) Kind() string                   { return "send_ride_receipt" }
func (r rawReceipt) MarshalJSON() ([]byte, error) { return r, nil }

// idleTransactions counts the transactions a second on pool's database over
// a quiet window: the enqueuers' idle cost (and this query's own, which is
// subtracted).
func idleTransactions(ctx context.Context, pool *pgxpool.Pool) (float64, error) {
	const window = 10 * time.Second
	read := func() (int64, error) {
		var n int64
		// pg_stat_database's counters are flushed by each backend at
		// most every second; pg_stat_clear_snapshot makes this
		// transaction read them anew.
		err := pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
		return n, err
	}
	// Let the backends report what the run counted: one that goes idle
	// reports at the latest after PostgreSQL's idle interval (10 s).
	if err := sleepCtx(ctx, 11*time.Second); err != nil {
		return 0, err
	}
	a, err := read()
	if err != nil {
		return 0, fmt.Errorf("staging: idle cost: %w", err)
	}
	if err := sleepCtx(ctx, window); err != nil {
		return 0, err
	}
	b, err := read()
	if err != nil {
		return 0, fmt.Errorf("staging: idle cost: %w", err)
	}
	return float64(b-a-1) / window.Seconds(), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// mergeStaging pools run b into a.
func mergeStaging(a, b StagingPhase) StagingPhase {
	if a.Runs == 0 {
		return b
	}
	a.Runs += b.Runs
	a.Commits += b.Commits
	a.Elapsed += b.Elapsed
	a.Copied += b.Copied
	a.commits = mergeSorted(a.commits, b.commits)
	a.toRiver = mergeSorted(a.toRiver, b.toRiver)
	a.CommitP50, a.CommitP99 = percentile(a.commits, 0.50), percentile(a.commits, 0.99)
	a.ToRiverP50, a.ToRiverP99 = percentile(a.toRiver, 0.50), percentile(a.toRiver, 0.99)
	a.PerRun = append(a.PerRun, b.PerRun...)
	return a
}

func mergeSorted(a, b []time.Duration) []time.Duration {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return out
}

// toRiver returns, sorted, the time from each commit's answer to the
// created_at of its River job (the enqueuer's insert), both clocks this
// machine's. Every measured commit must have exactly one job.
func toRiver(ctx context.Context, pool *pgxpool.Pool, commits []struct {
	id int64
	at time.Time
}, start time.Time, logf func(string, ...any)) ([]time.Duration, error) {
	at := make(map[int64]time.Time, len(commits))
	for _, c := range commits {
		at[c.id] = c.at
	}
	rows, err := pool.Query(ctx, `SELECT (metadata->>'idemd_staged_id')::bigint, created_at FROM river_job`)
	if err != nil {
		return nil, fmt.Errorf("staging: river jobs: %w", err)
	}
	lats := make([]time.Duration, 0, len(commits))
	seen := make(map[int64]bool, len(commits))
	// The slowest commit to River in each second of the run, for the log:
	// where in a run the tail comes from.
	var worst [64]time.Duration
	for rows.Next() {
		var id int64
		var created time.Time
		if err := rows.Scan(&id, &created); err != nil {
			return nil, fmt.Errorf("staging: river jobs: %w", err)
		}
		if seen[id] {
			return nil, fmt.Errorf("staging: two River jobs for staged id %d", id)
		}
		seen[id] = true
		if c, ok := at[id]; ok {
			lat := max(created.Sub(c), 0)
			lats = append(lats, lat)
			sec := int(c.Sub(start) / time.Second)
			if sec >= 0 && sec < len(worst) {
				worst[sec] = max(worst[sec], lat)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("staging: river jobs: %w", err)
	}
	if len(lats) != len(commits) {
		return nil, errors.New("staging: a measured commit has no River job")
	}
	var secs []string
	for i, w := range worst {
		if w > 0 {
			secs = append(secs, fmt.Sprintf("%ds:%s", i, w.Round(time.Millisecond)))
		}
	}
	logf("staging: slowest commit to River by second of the run: %s", strings.Join(secs, " "))
	slices.Sort(lats)
	return lats, nil
}

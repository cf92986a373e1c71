// Package load is the end-to-end load benchmark: what idemd costs the API
// it protects. Sustained Rocket Rides traffic runs against the real API
// process, with idemd's daemons as real processes, in four configurations
// measured in one run on one database server:
//
//	(a) the API with no background job;
//	(b) the API inserting the receipt job with River's InsertTx in the
//	    ride's last phase, plus the River worker (a Go API without idemd);
//	(c) the API staging the job (idem.StageJob), the enqueuers and the same
//	    worker;
//	(d) (c) plus the completers and the reaper at their defaults.
//
// For each it reports throughput, p50/p99, the database's CPU seconds and
// WAL bytes per request, and the 409 rate; then the 409 rate of requests
// with distinct keys of one user at 8 and 32 clients, for each isolation
// idem offers and the article's protocol. The benchmark report
// (internal/bench/report, suite "e2e") and TestLoad in internal/testing/e2e call it.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// Config is one configuration of the API and idemd under load.
type Config struct {
	// Name is the report's label, e.g. "(c) staged + enqueuers + worker".
	Name string
	// ReceiptJobs is rocketrides' --receipt-jobs: staged, river or none.
	ReceiptJobs string
	// Worker runs rocketrides' receipt worker (River).
	Worker bool
	// Isolation is rocketrides' --isolation (default read-committed).
	Isolation string
	// Daemons at their defaults (flags left at their default values but
	// for where to connect and listen; the reaper runs --schedule
	// "@every 10s" instead of a CronJob's hourly run, so its idle passes
	// fall inside the measurement).
	Enqueuers, Completers int
	Reaper                bool
	// EnqueuerArgs are added to the enqueuers' flags and EnqueuerEnv to
	// their environment (diagnostic runs).
	EnqueuerArgs, EnqueuerEnv []string
}

// The four configurations of the cost comparison.
var (
	ConfigA = Config{Name: "(a) API, no background job", ReceiptJobs: "none"}
	ConfigB = Config{Name: "(b) API + River InsertTx + worker", ReceiptJobs: "river", Worker: true}
	ConfigC = Config{Name: "(c) API staging + 2 enqueuers + worker", ReceiptJobs: "staged", Worker: true, Enqueuers: 2}
	ConfigD = Config{Name: "(d) (c) + 2 completers + reaper", ReceiptJobs: "staged", Worker: true, Enqueuers: 2, Completers: 2, Reaper: true}
)

// Isolations the conflict runs compare (rocketrides' --isolation).
var Isolations = []string{"read-committed", "serializable", "article-serializable"}

// LoadOptions tunes a run; zero values take the defaults.
type LoadOptions struct {
	// Duration of each cost configuration, split over Rounds runs (default
	// 90 s). The conflict runs last Duration/Rounds each.
	Duration time.Duration
	// Rounds: each cost configuration runs this many times (default 6),
	// once per round, in an order that changes from round to round
	// (roundOrder), and its runs are pooled, so a slow spell of the
	// shared machine hits all of them alike. Each configuration's runs
	// are also kept apart (Phase.PerRun) for ratios round by round.
	Rounds int
	// Warmup at the start of each run is not measured (default 5 s, at
	// most a sixth of a run): connections, plans, the first River jobs.
	Warmup time.Duration
	// Concurrency is the number of closed-loop clients of the cost runs
	// (default 8).
	Concurrency int
	// ConflictConcurrency: the conflict runs' client counts (default 8,
	// 32); none when SkipConflicts.
	ConflictConcurrency []int
	SkipConflicts       bool
	// GiveUpRate is the share of the cost runs' requests whose client
	// walks away mid-request (default 0.05), so the completers have keys
	// to finish. The conflict runs have none: every 409 there is a false
	// conflict.
	GiveUpRate float64
	// Riders to spread the cost runs' traffic over (default 20); the
	// conflict runs have one.
	Riders int
	// Configs replaces the cost configurations (default a, b, c, d).
	Configs []Config
	// SharedServer runs on the server of Load's adminURL instead of a
	// private cluster started for the run (dbtest.NewClusterWith, durable; also the fallback
	// when none can be started). A shared server's other work then counts
	// in the WAL figure, and its background processes are not in the CPU
	// figure.
	SharedServer bool
	Logf         func(string, ...any)
}

func (o *LoadOptions) defaults() {
	if o.Duration <= 0 {
		o.Duration = 90 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 6
	}
	run := o.Duration / time.Duration(o.Rounds)
	if o.Warmup <= 0 {
		o.Warmup = 5 * time.Second
	}
	o.Warmup = min(o.Warmup, (run / 6).Round(100*time.Millisecond))
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if len(o.ConflictConcurrency) == 0 {
		o.ConflictConcurrency = []int{8, 32}
	}
	if o.GiveUpRate == 0 {
		o.GiveUpRate = 0.05
	}
	if o.Riders <= 0 {
		o.Riders = 20
	}
	if len(o.Configs) == 0 {
		o.Configs = []Config{ConfigA, ConfigB, ConfigC, ConfigD}
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// Phase is one configuration measured (its runs pooled).
type Phase struct {
	Name      string
	Isolation string
	Clients   int
	Runs      int
	// Duration is the measured time (warm-ups excluded), summed over runs.
	Duration time.Duration
	// Answered requests (any HTTP status) started after the warm-up, and
	// their rate.
	Requests   int
	Throughput float64 // answered requests per second
	Status     map[int]int
	GaveUp     int // requests the clients abandoned (not in the latencies)
	Errors     int // transport errors other than giving up
	P50, P99   time.Duration
	Max        time.Duration
	// DBCPU is the CPU time (user + system) of the server processes
	// connected to the run's database (the API's, River's and the daemons'
	// backends, autovacuum on it) during the measured window, from
	// /proc/<pid>/stat; DBCPUOK is false when /proc could not be read.
	DBCPU   time.Duration
	DBCPUOK bool
	// APICPU and DaemonCPU are the CPU time (user + system) of the
	// rocketrides process (the API, and the River worker where it runs)
	// and of idemd's daemon processes over the same window, from
	// /proc/<pid>/stat; ProcCPUOK is false when a process could not be
	// read.
	APICPU, DaemonCPU time.Duration
	ProcCPUOK         bool
	// WALBytes the server wrote during the measured window
	// (pg_current_wal_insert_lsn before and after). Server-wide: other
	// databases' writes at the same time count too.
	WALBytes int64
	// After each run, summed: River jobs created, staged jobs not yet
	// moved, and keys neither finished nor flagged (the completers'
	// backlog).
	RiverJobs, Staged, OpenKeys int
	// PerRun holds each run's own figures, in round order.
	PerRun []RunFigures

	latencies []time.Duration // sorted, for pooling runs
}

// RunFigures are one run's throughput and p99.
type RunFigures struct {
	Throughput float64
	P99        time.Duration
}

// ConflictRate is the share of answered requests that got 409.
func (p Phase) ConflictRate() float64 {
	if p.Requests == 0 {
		return 0
	}
	return float64(p.Status[http.StatusConflict]) / float64(p.Requests)
}

// APICPUPerRequest and DaemonCPUPerRequest are APICPU and DaemonCPU over
// the answered requests.
func (p Phase) APICPUPerRequest() time.Duration    { return perRequest(p.APICPU, p.Requests) }
func (p Phase) DaemonCPUPerRequest() time.Duration { return perRequest(p.DaemonCPU, p.Requests) }

func perRequest(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// CPUPerRequest is DBCPU over the answered requests.
func (p Phase) CPUPerRequest() time.Duration { return perRequest(p.DBCPU, p.Requests) }

// WALPerRequest is WALBytes over the answered requests.
func (p Phase) WALPerRequest() float64 {
	if p.Requests == 0 {
		return 0
	}
	return float64(p.WALBytes) / float64(p.Requests)
}

// LoadReport is the result of Load.
type LoadReport struct {
	// Server says which server the run measured: a private cluster or the
	// shared one, and how its CPU was measured.
	Server      string
	Concurrency int
	Rounds      int
	Warmup      time.Duration
	// Cost holds the configurations in order (a, b, c, d by default).
	Cost []Phase
	// Conflicts: one user, distinct keys, no give-ups, API as in (a) but
	// staging its job, for each isolation and client count.
	Conflicts []Phase
}

// Find returns the cost phase named name.
func (r *LoadReport) Find(name string) (Phase, bool) {
	for _, p := range r.Cost {
		if p.Name == name {
			return p, true
		}
	}
	return Phase{}, false
}

// RoundRatios are a's throughput and p99 over b's, run by run: the runs
// of one round ran minutes apart at most, so a slow spell of the machine
// that lasts a round touches both sides of each ratio. Nil when the two
// have different numbers of runs.
func RoundRatios(a, b Phase) (throughput, p99 []float64) {
	if len(a.PerRun) != len(b.PerRun) {
		return nil, nil
	}
	for i := range a.PerRun {
		ra, rb := a.PerRun[i], b.PerRun[i]
		if rb.Throughput > 0 && rb.P99 > 0 {
			throughput = append(throughput, ra.Throughput/rb.Throughput)
			p99 = append(p99, float64(ra.P99)/float64(rb.P99))
		}
	}
	return throughput, p99
}

// Median of xs (0 when empty).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// roundOrder is the order the n configurations run in round r: the rows
// of a balanced Latin square (Williams' design: 0, 1, n-1, 2, n-2, ...,
// shifted by r). Over n rounds every configuration runs once in every
// position and, for even n, after every other configuration once, so
// neither a drift over the whole run nor a slow spell that spans two
// adjacent runs lands on one configuration more than another. (The
// earlier a-d, d-a put the two runs of (d) side by side in every pair of
// rounds.)
func roundOrder(n, r int) []int {
	order := make([]int, 0, n)
	order = append(order, 0)
	for lo, hi := 1, n-1; len(order) < n; {
		order = append(order, lo)
		lo++
		if len(order) < n {
			order = append(order, hi)
			hi--
		}
	}
	for i := range order {
		order[i] = (order[i] + r) % n
	}
	return order
}

// Ratio of a's throughput and p99 to b's.
func Ratio(a, b Phase) (throughput, p99 float64) {
	if b.Throughput > 0 {
		throughput = a.Throughput / b.Throughput
	}
	if b.P99 > 0 {
		p99 = float64(a.P99) / float64(b.P99)
	}
	return throughput, p99
}

// Load builds the binaries and runs every configuration, each run in a
// fresh database (dropped afterwards) on a private cluster, or with
// SharedServer on the server of adminURL, so no run inherits another's
// table sizes.
func Load(ctx context.Context, adminURL string, opts LoadOptions) (*LoadReport, error) {
	opts.defaults()
	rep := &LoadReport{Concurrency: opts.Concurrency, Rounds: opts.Rounds, Warmup: opts.Warmup,
		Server: "the shared server; CPU of the backends connected to each run's database, WAL server-wide"}
	env, err := newBenchEnv(ctx, adminURL, opts.SharedServer, "load", opts.Logf)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if env.private {
		rep.Server = "a private cluster (PostgreSQL's defaults, max_connections 300); CPU of all its processes, its WAL"
	}
	admin, err := pgxpool.New(ctx, env.adminURL)
	if err != nil {
		return nil, fmt.Errorf("load: admin pool: %w", err)
	}
	defer admin.Close()
	b := &bench{admin: admin, adminURL: env.adminURL, private: env.private, bins: env.bins, dir: env.dir, opts: opts}
	runLen := opts.Duration / time.Duration(opts.Rounds)
	pooled := make([]Phase, len(opts.Configs))
	for round := range opts.Rounds {
		for _, i := range roundOrder(len(opts.Configs), round) {
			ph, err := b.run(ctx, opts.Configs[i], runSpec{clients: opts.Concurrency, riders: opts.Riders, declines: 1, giveUp: opts.GiveUpRate, length: runLen})
			if err != nil {
				return nil, err
			}
			pooled[i] = merge(pooled[i], ph)
		}
	}
	rep.Cost = pooled
	if !opts.SkipConflicts {
		for i, clients := range opts.ConflictConcurrency {
			isos := slices.Clone(Isolations)
			if i%2 == 1 {
				slices.Reverse(isos) // neither always meets the machine first
			}
			for _, iso := range isos {
				cfg := Config{Name: "distinct keys, one user", ReceiptJobs: "staged", Isolation: iso}
				ph, err := b.run(ctx, cfg, runSpec{clients: clients, riders: 1, length: runLen})
				if err != nil {
					return nil, err
				}
				rep.Conflicts = append(rep.Conflicts, ph)
			}
		}
		slices.SortStableFunc(rep.Conflicts, func(a, b Phase) int {
			if a.Clients != b.Clients {
				return a.Clients - b.Clients
			}
			return slices.Index(Isolations, a.Isolation) - slices.Index(Isolations, b.Isolation)
		})
	}
	return rep, nil
}

// benchEnv is what every run of a benchmark shares: the server its
// databases are created on and the binaries.
type benchEnv struct {
	adminURL string
	private  bool // adminURL is a private cluster (dbtest.NewClusterWith)
	dir      string
	bins     *system.Binaries
	close    func()
}

// newBenchEnv starts a private cluster with PostgreSQL's defaults (fsync
// on, so WAL and CPU are a real server's) unless shared, falling back to
// adminURL's server when none can be started, and builds the binaries into
// a temporary directory. close removes both. name prefixes the errors and
// the log line.
func newBenchEnv(ctx context.Context, adminURL string, shared bool, name string, logf func(string, ...any)) (*benchEnv, error) {
	env := &benchEnv{adminURL: adminURL}
	var cleanups []func()
	env.close = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	if !shared {
		srv, err := dbtest.NewClusterWith(dbtest.ClusterOptions{Durable: true})
		if err != nil {
			logf("%s: no private server (%v): measuring on the shared one", name, err)
		} else {
			cleanups = append(cleanups, func() { srv.Remove() })
			env.adminURL, env.private = srv.URL(), true
		}
	}
	dir, err := os.MkdirTemp("", "idemd-"+name+"-")
	if err != nil {
		env.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	env.dir = dir
	if env.bins, err = system.Build(ctx, filepath.Join(dir, "bin")); err != nil {
		env.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cleanups = append(cleanups, system.CloseIdleConnections)
	return env, nil
}

type bench struct {
	admin    *pgxpool.Pool
	adminURL string
	private  bool // adminURL is a private cluster (dbtest.NewClusterWith)
	bins     *system.Binaries
	dir      string
	opts     LoadOptions
}

type runSpec struct {
	clients, riders int
	declines        int // riders whose card is declined (402)
	giveUp          float64
	length          time.Duration
}

// run measures one configuration once, in a fresh database.
func (b *bench) run(ctx context.Context, cfg Config, spec runSpec) (ph Phase, err error) {
	ph.Name, ph.Isolation, ph.Clients, ph.Runs = cfg.Name, cmpOr(cfg.Isolation, "read-committed"), spec.clients, 1
	dir, err := os.MkdirTemp(b.dir, "run-")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	// The API and the measurement keep the admin URL (the API's role is
	// the operator's).
	dbURL, drop, err := system.CreateDatabase(ctx, b.adminURL, b.bins, "idemd_load")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	defer func() {
		if derr := drop(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = fmt.Errorf("load: %w", derr)
		}
	}()
	secretPath, _, err := system.WriteSecret(dir, "replay-secret")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	var rr *system.RocketRides
	err = system.StartRetrying(func() (*system.Proc, error) {
		var err error
		rr, err = b.newAPI(cfg, dbURL, secretPath, dir, spec.clients)
		if err != nil {
			return nil, err
		}
		return rr.Proc, nil
	}, func(*system.Proc) error { return apiUp(ctx, rr) })
	if err != nil {
		return ph, err
	}
	defer rr.Close()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return ph, fmt.Errorf("load: pool: %w", err)
	}
	defer pool.Close()
	riders, err := system.Riders(ctx, pool, spec.riders, spec.declines)
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	var procs []*system.Proc
	for _, d := range b.daemons(cfg, dbURL, rr.APIURL, secretPath, dir) {
		var p *system.Proc
		err := system.StartRetrying(func() (*system.Proc, error) {
			var err error
			p, err = d()
			return p, err
		}, func(p *system.Proc) error { return system.WaitReady(ctx, p) })
		if err != nil {
			return ph, err
		}
		defer p.Close()
		procs = append(procs, p)
	}
	dbName, err := databaseName(ctx, pool)
	if err != nil {
		return ph, err
	}
	b.opts.Logf("load: %s, %s, %d clients, %s (%s warm-up)", cfg.Name, ph.Isolation, spec.clients, spec.length, b.opts.Warmup)
	if err := b.drive(ctx, rr.APIURL, riders, dbName, spec, &ph, procMeter{api: rr.Proc, daemons: procs}); err != nil {
		return ph, err
	}
	for _, p := range append([]*system.Proc{rr.Proc}, procs...) {
		if _, _, unexpected := p.Counts(); len(unexpected) > 0 {
			return ph, fmt.Errorf("load: %s exited during the run: %v\n%s", p.Name, unexpected, p.LogTail(2000))
		}
	}
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM river_job), (SELECT count(*) FROM staged_jobs),
		(SELECT count(*) FROM idempotency_keys k WHERE recovery_point <> 'finished'
		 AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id))`).Scan(&ph.RiverJobs, &ph.Staged, &ph.OpenKeys); err != nil {
		return ph, fmt.Errorf("load: counts: %w", err)
	}
	b.opts.Logf("load: %s: %.0f req/s, p50 %s, p99 %s, statuses %v, gave up %d, DB CPU %s/request, WAL %.0f B/request, River jobs %d, staged %d, open keys %d",
		cfg.Name, ph.Throughput, ph.P50, ph.P99, ph.Status, ph.GaveUp, ph.CPUPerRequest(), ph.WALPerRequest(), ph.RiverJobs, ph.Staged, ph.OpenKeys)
	if ph.Requests == 0 {
		return ph, errors.New("load: no request was answered")
	}
	return ph, nil
}

// apiUp waits up to a minute for the API's own /healthz, which it serves
// once it has created its tables (its /readyz may pass before).
func apiUp(ctx context.Context, rr *system.RocketRides) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if !rr.Running() {
			return false, errors.New("exited")
		}
		req, err := http.NewRequestWithContext(wctx, http.MethodGet, rr.APIURL+"/healthz", nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return fmt.Errorf("load: rocketrides did not come up: %w\n%s", err, rr.LogTail(2000))
	}
	return nil
}

// newAPI returns the rocketrides process of cfg (not started), on free
// ports. Its pool has a connection per client and four more
// (pool_max_conns), so the clients' requests meet in the database instead
// of queueing for a connection.
func (b *bench) newAPI(cfg Config, dbURL, secretPath, dir string, clients int) (*system.RocketRides, error) {
	var addrs [4]string
	for i := range addrs {
		a, err := system.FreeAddr()
		if err != nil {
			return nil, fmt.Errorf("load: %w", err)
		}
		addrs[i] = a
	}
	apiURL, err := withParam(dbURL, "pool_max_conns", fmt.Sprint(clients+4))
	if err != nil {
		return nil, err
	}
	args := []string{
		"--database-url", apiURL, "--log-format", "console", "--log-level", "warn",
		"--addr", addrs[0], "--admin-addr", addrs[1], "--stripe-addr", addrs[2], "--http-addr", addrs[3],
		"--replay-secret-file", secretPath,
		"--receipt-jobs", cfg.ReceiptJobs, "--isolation", cmpOr(cfg.Isolation, "read-committed"),
	}
	if !cfg.Worker {
		args = append(args, "--no-receipts")
	}
	return &system.RocketRides{
		Proc:   &system.Proc{Name: "rocketrides", Bin: b.bins.RocketRides, LogPath: filepath.Join(dir, "rocketrides.log"), OpsAddr: addrs[3], Args: args},
		APIURL: "http://" + addrs[0], AdminURL: "http://" + addrs[1], StripeURL: "http://" + addrs[2],
	}, nil
}

// daemons returns a constructor per daemon process of cfg, each with its
// flags at their defaults but for where to connect and listen (a free
// port per call).
func (b *bench) daemons(cfg Config, dbURL, apiURL, secretPath, dir string) []func() (*system.Proc, error) {
	runtimeURL := dbtest.RuntimeURL(dbURL)
	var procs []func() (*system.Proc, error)
	add := func(name, bin string, env []string, extra ...string) {
		procs = append(procs, func() (*system.Proc, error) {
			addr, err := system.FreeAddr()
			if err != nil {
				return nil, fmt.Errorf("load: %w", err)
			}
			args := append([]string{"--database-url", runtimeURL, "--log-format", "console", "--log-level", "warn", "--http-addr", addr}, extra...)
			return &system.Proc{Name: name, Bin: bin, Args: args, Env: env, OpsAddr: addr, LogPath: filepath.Join(dir, name+".log")}, nil
		})
	}
	for i := range cfg.Enqueuers {
		add(fmt.Sprintf("enqueuer-%d", i+1), b.bins.Enqueuer, cfg.EnqueuerEnv, cfg.EnqueuerArgs...)
	}
	for i := range cfg.Completers {
		add(fmt.Sprintf("completer-%d", i+1), b.bins.Completer, nil, "--api-url", apiURL, "--auth-secret-file", secretPath)
	}
	if cfg.Reaper {
		add("reaper", b.bins.Reaper, nil, "--schedule", "@every 10s")
	}
	return procs
}

// drive runs closed-loop clients for spec.length: each sends a ride with a
// fresh key as soon as its previous one is answered. Requests started in
// the warm-up are not measured; the database's CPU and WAL are measured
// from the end of the warm-up to the end of the run.
func (b *bench) drive(ctx context.Context, apiURL string, riders []string, dbName string, spec runSpec, ph *Phase, procs procMeter) error {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: spec.clients}}
	defer client.CloseIdleConnections()
	runCtx, cancel := context.WithTimeout(ctx, spec.length)
	defer cancel()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
		measuring bool
	)
	ph.Status = map[int]int{}
	for range spec.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				giveUp := spec.giveUp > 0 && rand.Float64() < spec.giveUp
				reqCtx, rcancel := context.WithCancel(runCtx)
				if giveUp {
					t := time.AfterFunc(time.Duration(rand.IntN(20_000))*time.Microsecond, rcancel)
					defer t.Stop()
				}
				mu.Lock()
				counted := measuring
				mu.Unlock()
				t0 := time.Now()
				status, err := post(reqCtx, client, apiURL, riders[rand.IntN(len(riders))])
				d := time.Since(t0)
				rcancel()
				if !counted {
					continue
				}
				mu.Lock()
				switch {
				case err != nil && giveUp:
					ph.GaveUp++
				case err != nil && runCtx.Err() != nil:
					// Cut off by the end of the run: not a measurement.
				case err != nil:
					ph.Errors++
				default:
					ph.Status[status]++
					latencies = append(latencies, d)
				}
				mu.Unlock()
			}
		}()
	}
	// The warm-up, then the measured window.
	select {
	case <-time.After(b.opts.Warmup):
	case <-runCtx.Done():
	}
	var cpu cpuMeter = newDatabaseCPU(b.admin, dbName)
	if b.private {
		// Every run's window starts right after a checkpoint, so each pays
		// the same full-page images in its WAL.
		if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
			return fmt.Errorf("load: checkpoint: %w", err)
		}
		sc, err := newServerCPU(ctx, b.admin)
		if err != nil {
			return err
		}
		cpu = sc
	}
	lsn, lsnErr := walLSN(ctx, b.admin)
	cpuErr := cpu.sample(ctx)
	api0, daemons0, procErr := procs.sample()
	mu.Lock()
	measuring = true
	mu.Unlock()
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	for done := false; !done; {
		select {
		case <-runCtx.Done():
			done = true
		case <-tick.C:
			if err := cpu.sample(ctx); err != nil && cpuErr == nil {
				cpuErr = err
			}
		}
	}
	tick.Stop()
	if err := cpu.sample(ctx); err != nil && cpuErr == nil {
		cpuErr = err
	}
	api1, daemons1, err := procs.sample()
	if procErr == nil {
		procErr = err
	}
	ph.APICPU, ph.DaemonCPU, ph.ProcCPUOK = api1-api0, daemons1-daemons0, procErr == nil
	if procErr != nil {
		b.opts.Logf("load: process CPU not measured: %v", procErr)
	}
	ph.Duration = time.Since(start)
	if lsnErr == nil {
		ph.WALBytes, lsnErr = walSince(ctx, b.admin, lsn)
	}
	wg.Wait()
	if lsnErr != nil {
		return fmt.Errorf("load: WAL position: %w", lsnErr)
	}
	ph.DBCPU, ph.DBCPUOK = cpu.total(), cpuErr == nil
	if cpuErr != nil {
		b.opts.Logf("load: database CPU not measured: %v", cpuErr)
	}
	ph.Requests = len(latencies)
	ph.Throughput = float64(len(latencies)) / ph.Duration.Seconds()
	slices.Sort(latencies)
	ph.P50, ph.P99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
	if n := len(latencies); n > 0 {
		ph.Max = latencies[n-1]
	}
	ph.PerRun = []RunFigures{{Throughput: ph.Throughput, P99: ph.P99}}
	ph.latencies = latencies
	return nil
}

// merge pools a second run of one configuration into a.
func merge(a, b Phase) Phase {
	if a.Runs == 0 {
		return b
	}
	a.Runs += b.Runs
	a.Duration += b.Duration
	a.Requests += b.Requests
	for c, n := range b.Status {
		a.Status[c] += n
	}
	a.GaveUp += b.GaveUp
	a.Errors += b.Errors
	a.DBCPU += b.DBCPU
	a.DBCPUOK = a.DBCPUOK && b.DBCPUOK
	a.APICPU += b.APICPU
	a.DaemonCPU += b.DaemonCPU
	a.ProcCPUOK = a.ProcCPUOK && b.ProcCPUOK
	a.WALBytes += b.WALBytes
	a.RiverJobs += b.RiverJobs
	a.Staged += b.Staged
	a.OpenKeys += b.OpenKeys
	a.PerRun = append(a.PerRun, b.PerRun...)
	a.latencies = append(a.latencies, b.latencies...)
	slices.Sort(a.latencies)
	a.Throughput = float64(a.Requests) / a.Duration.Seconds()
	a.P50, a.P99 = percentile(a.latencies, 0.50), percentile(a.latencies, 0.99)
	if n := len(a.latencies); n > 0 {
		a.Max = a.latencies[n-1]
	}
	return a
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func post(ctx context.Context, client *http.Client, apiURL, apiKey string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/rides", strings.NewReader(simulator.RandomParams().Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

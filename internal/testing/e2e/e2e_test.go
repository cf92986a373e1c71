//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/alertcheck"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/horizon"
	"github.com/idemd/idemd/internal/testing/pgbouncertest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Durations of the run. The traffic runs while the scripted faults play out
// one after another and the killer SIGKILLs daemons at random.
const (
	trafficFor   = 55 * time.Second
	settleWithin = 2 * time.Minute // deadline for the system to drain after the faults
	grace        = 2 * time.Second // the completers' --grace
)

// env is everything one run of the suite holds.
type env struct {
	t       *testing.T
	dir     string
	bins    *system.Binaries
	cluster *dbtest.Cluster
	proxy   *tcpproxy.Proxy
	pool    *pgxpool.Pool // direct to PostgreSQL, for seeding and the oracle
	dbURL   string
	rr      *system.RocketRides
	front   *replayFront
	frontSv *httptest.Server
	daemons *system.DaemonSet

	// chaos serialises SIGKILLs with the scripted faults that watch
	// specific processes (the PostgreSQL outage polls their /readyz).
	chaos   sync.Mutex
	eventMu sync.Mutex
	events  []string
	poison  []int64

	// Pooled runs only: the PgBouncer between the daemons and PostgreSQL,
	// the database's name, and the stop of the other clients' load (it
	// returns how many transactions they ran).
	bouncer  *pgbouncertest.Bouncer
	dbName   string
	stopLoad func() int64

	// alerts records the daemons' metrics and the faults' moments, for
	// promtool to evaluate the alerts over (alerts_test.go).
	alerts *alertRun
}

// checkSessions: a run leaves no session state behind. Only one reaper
// runs, so no run may have found the lease held by a live run; no session
// of the database holds an advisory lock; and, pooled, no server connection
// of the pool keeps an advisory lock, a LISTEN, a prepared statement or a
// changed setting for the next client.
func (e *env) checkSessions(ctx context.Context) {
	t := e.t
	if log, err := os.ReadFile(e.daemons.Reaper.LogPath); err != nil {
		t.Errorf("reaper log: %v", err)
	} else if n := strings.Count(string(log), "another reaper run holds the lease"); n > 0 {
		t.Errorf("the only reaper found the lease held by a live run %d times", n)
	} else {
		e.logf("reaper: %d runs took over a killed run's lease", strings.Count(string(log), "took over the lease"))
	}
	if locks, err := dbtest.AdvisoryLocks(ctx, e.pool); err != nil || locks != 0 {
		t.Errorf("advisory locks held after the run: %d (%v)", locks, err)
	}
	if e.bouncer == nil {
		return
	}
	if n := e.stopLoad(); n == 0 {
		t.Error("no other client used the pool")
	} else {
		e.logf("other clients ran %d transactions through the pool", n)
	}
	leaks, err := e.bouncer.Leaks(ctx, e.dbName, dbtest.RuntimeRole, "application_name")
	if err != nil {
		t.Errorf("inspect the pool's server connections: %v", err)
	}
	for _, l := range leaks {
		t.Errorf("server connection left with session state: %s", l)
	}
}

// checkHorizon fails the run when a session of idemd held a snapshot
// longer than the bound at any sample.
func (e *env) checkHorizon(rep horizon.Report) {
	e.logf("xmin horizon: %s", rep)
	if err := rep.Err(); err != nil {
		e.t.Error(err)
	}
}

func (e *env) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	e.eventMu.Lock()
	e.events = append(e.events, time.Now().Format("15:04:05.000")+" "+msg)
	e.eventMu.Unlock()
	e.t.Log(msg)
}

// TestFaults is the suite: Rocket Rides with 2 enqueuers, 2 completers and
// the reaper under every fault of issue 7, then the oracle.
func TestFaults(t *testing.T) { runFaults(t, false) }

// TestFaultsThroughPgBouncer is the same suite with the daemons reaching
// PostgreSQL through a real PgBouncer in transaction mode (the proxy's cuts
// between them and it), the enqueuers listening on a direct connection, and
// other clients sharing the pool. Afterwards no server connection of the
// pool may hold an advisory lock, a LISTEN, a prepared statement or a
// changed setting.
func TestFaultsThroughPgBouncer(t *testing.T) { runFaults(t, true) }

func runFaults(t *testing.T, pooled bool) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := setUp(ctx, t, pooled)
	defer system.CloseIdleConnections()
	e.startRecording(ctx)
	// No session of idemd may hold a snapshot longer than its longest
	// statement, through every fault (docs/design.md, invariant 7).
	hz := horizon.Start(ctx, e.pool, horizon.Options{Roles: []string{dbtest.RuntimeRole}, Logf: e.logf})

	// Traffic: riders who give up mid-request (a fifth of them) and retry
	// after a 409 or 5xx; decliners among them.
	riders, err := system.Riders(ctx, e.pool, 12, 2)
	if err != nil {
		t.Fatal(err)
	}
	simClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer simClient.CloseIdleConnections()
	simDone := make(chan simulator.Stats, 1)
	go func() {
		st, err := simulator.Run(ctx, simulator.Config{
			BaseURL: e.rr.APIURL, APIKeys: riders, Concurrency: 6, Duration: trafficFor,
			GiveUpRate: 0.2, GiveUpAfter: 60 * time.Millisecond, MaxRetries: 2, HTTPClient: simClient,
		})
		if err != nil {
			t.Errorf("simulator: %v", err)
		}
		simDone <- st
	}()

	// The running system, before any fault (no alert may fire), then the
	// old keys (the reaper's and the completers' give-up work).
	e.healthyStart(ctx)
	if err := e.seedOldKeys(ctx); err != nil {
		t.Fatal(err)
	}

	killerStop := make(chan struct{})
	killerDone := make(chan struct{})
	e.alerts.mark("killer start")
	go func() { defer close(killerDone); e.killer(killerStop) }()

	e.script(ctx)

	stats := <-simDone
	close(killerStop)
	<-killerDone
	e.alerts.mark("killer stop")
	e.logf("traffic done: %s", stats)
	if stats.Created == 0 || stats.GaveUp == 0 {
		t.Errorf("traffic did not exercise the system: %s", stats)
	}
	if stats.Rejected > 0 {
		t.Errorf("%d requests rejected with a 4xx other than 402/409: the simulator or the API is broken", stats.Rejected)
	}

	// Every daemon runs again (the killer may have left none down, but be
	// sure), then the system must drain by itself.
	for _, p := range e.daemons.All() {
		if !p.Running() {
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.settle(ctx)
	e.checkProcesses()
	e.checkAlerts(ctx)

	stopDaemons(t, e.daemons, "system's")
	e.oracle(ctx, stats)
	e.checkHorizon(hz.Stop())
	e.checkSessions(ctx)
	e.scanLogs()
	e.status(ctx)
	t.Logf("suite took %s", time.Since(started).Round(time.Second))
	if t.Failed() {
		for _, p := range append(e.daemons.All(), e.rr.Proc) {
			t.Logf("---- tail of %s\n%s", p.Name, p.LogTail(3000))
		}
		t.Logf("---- PostgreSQL log tail\n%s", tail(e.cluster.LogPath(), 3000))
	}
}

func setUp(ctx context.Context, t *testing.T, pooled bool) *env {
	t.Helper()
	e, opts := prepare(ctx, t, pooled)
	opts.Enqueuers, opts.Completers, opts.Reaper = 2, 2, true
	e.startDaemons(ctx, opts)
	e.logf("set up in its own cluster (port %d), daemons through proxy %s (PgBouncer: %v), all ready", e.cluster.Port(), e.proxy.Addr(), pooled)
	return e
}

// prepare builds the binaries and starts everything but the daemons: the
// run's own cluster and database (roles applied, migrated with idemctl),
// optionally a PgBouncer in front of it, and the surroundings. It returns
// the daemon options that point at them, with Dir and, pooled, the
// pooler's arguments set; the caller says how many daemons of each.
func prepare(ctx context.Context, t *testing.T, pooled bool) (*env, system.DaemonOptions) {
	t.Helper()
	e := &env{t: t, dir: t.TempDir()}
	var err error
	if e.bins, err = system.Build(ctx, filepath.Join(e.dir, "bin")); err != nil {
		t.Fatal(err)
	}
	e.cluster = dbtest.StartCluster(t)
	var drop func(context.Context) error
	if e.dbURL, drop, err = scratchdb.Create(ctx, e.cluster.URL(), "idemd_e2e"); err != nil {
		t.Fatal(err)
	}
	_ = drop // the cluster is removed with the test
	// The roles of deploy/sql/roles.sql, applied as the operator would
	// (e.dbURL is the cluster's superuser: the API's role here, and the
	// suite's own inspection). `idemctl migrate` runs as idemd_migrator
	// and every daemon as idemd_runtime, as docs/operations.md deploys them.
	if err := dbtest.ApplyRoles(ctx, e.dbURL); err != nil {
		t.Fatal(err)
	}
	if err := system.Migrate(ctx, e.bins, dbtest.MigratorURL(e.dbURL)); err != nil {
		t.Fatal(err)
	}
	// The daemons' path: the proxy (for cuts), then PostgreSQL or, pooled,
	// a PgBouncer in transaction mode in front of it.
	target := fmt.Sprintf("127.0.0.1:%d", e.cluster.Port())
	var extraArgs, enqueuerArgs []string
	if pooled {
		e.bouncer = pgbouncertest.Start(t, pgbouncertest.Options{BackendURL: e.cluster.URL(), PoolSize: 12, Users: []string{dbtest.RuntimeRole}})
		target = e.bouncer.Addr
		extraArgs = []string{"--pooler", "transaction"}
		// LISTEN is session state: the enqueuers listen on a direct
		// connection, as docs/operations.md tells operators to.
		enqueuerArgs = []string{"--listen-database-url", dbtest.RuntimeURL(e.dbURL)}
		e.dbName = pgbouncertest.DatabaseName(t, e.dbURL)
		loadCtx, stopLoad := context.WithCancel(ctx)
		wait, n := e.bouncer.Load(loadCtx, e.dbName, "postgres", 2)
		e.stopLoad = func() int64 {
			stopLoad()
			// The suite stops and restarts PostgreSQL: a load client ends
			// at the first error it meets, which is no finding here.
			if err := wait(); err != nil {
				e.logf("pool load ended early: %v", err)
			}
			return n.Load()
		}
	}
	if e.pool, err = pgxpool.New(ctx, e.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)

	opts := e.startSurroundings(ctx, target)
	opts.Dir = e.dir
	opts.ExtraArgs, opts.ExtraEnqueuerArgs = extraArgs, enqueuerArgs
	return e, opts
}

// startDaemons starts the daemon set of opts and waits until every daemon
// is ready and every enqueuer is the drainer or a standby.
func (e *env) startDaemons(ctx context.Context, opts system.DaemonOptions) {
	t := e.t
	t.Helper()
	var err error
	if e.daemons, err = system.NewDaemons(e.bins, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.daemons.Close)
	if err := e.daemons.Start(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, p := range e.daemons.All() {
		if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
			ok, why := p.Ready(wctx)
			if !ok {
				return false, fmt.Errorf("%s", why)
			}
			return true, nil
		}); err != nil {
			t.Fatalf("%s never became ready: %v\n%s", p.Name, err, p.LogTail(3000))
		}
	}
	// Ready is not settled: an enqueuer answers /readyz after its first
	// sweep, possibly before its listener has proved itself and won or
	// lost the drainer election. Until then it is neither the drainer
	// (listener_up 1) nor a standby (standby 1), which is what
	// IdemdEnqueuerListenerDown reads, without its for:, in the healthy
	// start; wait for every enqueuer to be one or the other.
	for _, p := range e.daemons.Enqueuers {
		if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
			samples, err := metricSamples(wctx, p)
			if err != nil {
				return false, err
			}
			return slices.ContainsFunc(samples, func(s alertcheck.Sample) bool {
				return (s.Name == "idemd_enqueuer_listener_up" || s.Name == "idemd_enqueuer_standby") && s.Value == 1
			}), nil
		}); err != nil {
			t.Fatalf("%s is neither the drainer nor a standby: %v\n%s", p.Name, err, p.LogTail(3000))
		}
	}
}

// seedOldKeys gives the reaper work: keys past its 1 h retention by the
// database clock, finished ones (deleted silently) and unfinished ones
// (deleted only together with a review, by the reaper or by a completer
// giving up past its horizon).
func (e *env) seedOldKeys(ctx context.Context) error {
	var user int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO users (email, stripe_customer_id, api_key_sha256)
		VALUES ('e2e-old@example.com', 'cus_e2e_old', 'e2e-old-key') RETURNING id`).Scan(&user); err != nil {
		return fmt.Errorf("seed user: %w", err)
	}
	_, err := e.pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
    request_path, response_code, response_body, recovery_point, user_id, upstream_idempotency_key)
SELECT now() - interval '80 hours', 'e2e-old-' || g, now() - interval '80 hours', NULL, 'POST',
    '{"origin_lat":"37.7","origin_lon":"-122.4","target_lat":"37.8","target_lon":"-122.5"}', '/rides',
    CASE WHEN g <= 40 THEN 201 END, CASE WHEN g <= 40 THEN '{}' END,
    CASE WHEN g <= 40 THEN 'finished' WHEN g <= 50 THEN 'started' ELSE 'ride_created' END,
    $1, gen_random_uuid()
FROM generate_series(1, 60) g`, user)
	if err != nil {
		return fmt.Errorf("seed old keys: %w", err)
	}
	return nil
}

// killer SIGKILLs a random daemon every one to three seconds and starts it
// again after a random pause (the first killed enqueuer or completer: once
// a scrape has seen it down), until stop is closed.
func (e *env) killer(stop <-chan struct{}) {
	all := e.daemons.All()
	seenDown := false
	for {
		t := time.NewTimer(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C: // a random moment for the next fault
		}
		e.chaos.Lock()
		p := all[rand.IntN(len(all))]
		if err := p.Kill(); err != nil {
			e.t.Errorf("kill %s: %v", p.Name, err)
			e.chaos.Unlock()
			continue
		}
		killed := time.Now()
		pause := time.Duration(rand.IntN(600)) * time.Millisecond
		time.Sleep(pause) // a daemon stays dead a random while, as under a real crash
		if !seenDown && container(p) != "reaper" {
			// Once, an enqueuer or completer stays down until a scrape has
			// seen it down: the kill is then certainly visible to
			// IdemdMetricsDown, not only likely (alerts_test.go).
			e.scraped(context.Background(), "a killed daemon")
			seenDown = true
		}
		if err := p.Start(); err != nil {
			e.t.Errorf("restart %s: %v", p.Name, err)
		}
		e.logf("SIGKILL %s, restarted after %s", p.Name, time.Since(killed).Round(time.Millisecond))
		e.chaos.Unlock()
	}
}

// sleep waits d to place the next fault at a random time; never used to
// wait for work.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func jitter(base time.Duration) time.Duration {
	return base + time.Duration(rand.Int64N(int64(base)))
}

// script plays the scripted faults one after another while traffic runs.
func (e *env) script(ctx context.Context) {
	t := e.t
	sleep(ctx, jitter(2*time.Second))

	// API errors: 500s anywhere and serialization failures (409s after
	// idem's retries) mid-ride, for clients and replays alike.
	if err := e.rr.SetFaults(ctx,
		api.FaultRule{At: "", Rate: 0.1, Kind: api.FaultInternal},
		api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 0.2, Kind: api.FaultSerialization},
	); err != nil {
		t.Fatal(err)
	}
	e.logf("API faults on")
	e.insertPoison(ctx)
	sleep(ctx, jitter(3*time.Second))
	if err := e.rr.SetFaults(ctx); err != nil {
		t.Fatal(err)
	}
	e.logf("API faults off")

	e.outage(ctx)
	sleep(ctx, jitter(time.Second))

	// Connections cut: everything between the daemons and PostgreSQL dies
	// at once, three times; then a slow network.
	for range 3 {
		n := e.proxy.Sever()
		e.logf("proxy: severed %d sockets", n)
		sleep(ctx, jitter(700*time.Millisecond))
	}
	e.proxy.SetLatency(40 * time.Millisecond)
	e.logf("proxy: 40 ms per chunk")
	sleep(ctx, jitter(2*time.Second))
	e.proxy.SetLatency(0)
	e.logf("proxy: latency off")

	e.clockSkew(ctx)

	// Timeouts: replays held past the completer's --request-timeout while
	// the API still does the work.
	e.front.setMode(modeSlow)
	e.logf("replays held 3.5 s (completer timeout 3 s)")
	sleep(ctx, jitter(3*time.Second))
	e.front.setMode(modeNormal)
	e.logf("replays at normal speed")

	// A plain pg_ctl restart -m fast, with the killer running.
	if err := e.cluster.Restart(); err != nil {
		t.Fatal(err)
	}
	e.logf("PostgreSQL restarted (pg_ctl restart -m fast)")
}

// insertPoison stages rows that can never be River jobs, among the
// traffic's own: an unknown kind, an invalid queue and oversized args. The
// killer is held off until they are dead-lettered and a scrape has seen the
// enqueuers' counters: a SIGKILL before that would reset the count unseen,
// and the fault under test here is the poison row.
func (e *env) insertPoison(ctx context.Context) {
	e.chaos.Lock()
	defer e.chaos.Unlock()
	e.alerts.mark("poison")
	big := strings.Repeat("x", 8000)
	rows := []struct{ sql string }{
		{`INSERT INTO staged_jobs (job_name, job_args) VALUES ('e2e_no_such_kind', '{}') RETURNING id`},
		{`INSERT INTO staged_jobs (job_name, job_args, queue) VALUES ('send_ride_receipt', '{"amount":1,"currency":"usd","user_id":1}', 'not a valid queue!') RETURNING id`},
		{`INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', jsonb_build_object('pad', '` + big + `')) RETURNING id`},
	}
	for _, r := range rows {
		var id int64
		if err := e.pool.QueryRow(ctx, r.sql).Scan(&id); err != nil {
			e.t.Fatalf("poison row: %v", err)
		}
		e.poison = append(e.poison, id)
	}
	e.logf("poison staged rows %v", e.poison)
	reasons, err := e.poisonReasons(ctx)
	if err != nil {
		e.t.Error(err)
	}
	for _, r := range reasons {
		e.counted(ctx, e.daemons.Enqueuers, "idemd_enqueuer_jobs_dead_lettered_total", map[string]string{"reason": r})
	}
	e.scraped(ctx, "poison rows dead-lettered")
}

// outage stops PostgreSQL, waits until the watched daemons' /readyz says
// not ready, starts it again and waits until they are ready again. The
// killer is held off meanwhile so that /readyz answers come from the same
// processes across the outage.
func (e *env) outage(ctx context.Context) {
	t := e.t
	e.chaos.Lock()
	defer e.chaos.Unlock()
	watched := []*system.Proc{e.daemons.Enqueuers[0], e.daemons.Completers[0], e.daemons.Reaper}
	e.alerts.mark("outage start")
	if err := e.cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	e.logf("PostgreSQL stopped (pg_ctl stop -m fast)")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, p := range watched {
		var why string
		if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
			ok, w := p.Ready(wctx)
			why = w
			return !ok && p.Running(), nil
		}); err != nil {
			t.Errorf("%s: /readyz never went false during the outage: %v", p.Name, err)
		} else {
			e.logf("%s /readyz false during the outage: %s", p.Name, why)
		}
	}
	// An outage shorter than a scrape interval is invisible to Prometheus:
	// this one lasts until a scrape has seen it.
	e.scraped(ctx, "PostgreSQL outage")
	e.alerts.mark("outage end")
	if err := e.cluster.Start(); err != nil {
		t.Fatal(err)
	}
	e.logf("PostgreSQL started again")
	rctx, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	for _, p := range watched {
		var why string
		if err := system.Poll(rctx, 50*time.Millisecond, func() (bool, error) {
			ok, w := p.Ready(rctx)
			why = w
			return ok, nil
		}); err != nil {
			t.Errorf("%s: /readyz never came back after the outage: %v (last: %s)", p.Name, err, why)
		} else {
			e.logf("%s /readyz true again", p.Name)
		}
	}
	// The same processes answered before and after: none restarted itself.
	for _, p := range watched {
		if _, _, unexpected := p.Counts(); len(unexpected) > 0 {
			t.Errorf("%s exited by itself around the outage: %v", p.Name, unexpected)
		}
	}
}

// clockSkew makes the signing side's clock run ten minutes ahead (past the
// API's 5-minute window): replays must be refused with 401, and once the
// clock is right the completers must get through again by themselves.
//
// The killer is held off until a scrape has seen the completers count the
// 401s: a SIGKILL before that would reset the count unseen.
func (e *env) clockSkew(ctx context.Context) {
	t := e.t
	e.chaos.Lock()
	e.alerts.mark("skew start")
	e.front.setMode(modeSkewed)
	e.logf("replay signer clock +10 min")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		return e.front.statusCount(modeSkewed, func(s int) bool { return s == http.StatusUnauthorized }) >= 3, nil
	}); err != nil {
		t.Errorf("no replay was refused while the signer's clock was skewed: %v (%s)", err, e.front.summary())
	}
	e.counted(ctx, e.daemons.Completers, "idemd_completer_replays_total", map[string]string{"outcome": "unauthorized"})
	e.scraped(ctx, "401s of the skewed clock")
	e.chaos.Unlock()
	if n := e.front.statusCount(modeSkewed, func(s int) bool { return s != http.StatusUnauthorized }); n > 0 {
		t.Errorf("%d skewed replays were not refused with 401: %s", n, e.front.summary())
	}
	e.front.setMode(modeRecover)
	e.logf("replay signer clock fixed")
	if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		return e.front.statusCount(modeRecover, func(s int) bool { return s == http.StatusCreated || s == http.StatusPaymentRequired }) > 0, nil
	}); err != nil {
		t.Errorf("completers did not recover after the clock was fixed: %v (%s)", err, e.front.summary())
	}
	e.front.setMode(modeNormal)
}

// settle waits, with a deadline, until the system has drained: nothing
// staged, every River job worked (but those of unworkedQueue), every key
// finished or flagged.
func (e *env) settle(ctx context.Context) {
	wctx, cancel := context.WithTimeout(ctx, settleWithin)
	defer cancel()
	var last string
	err := system.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		var staged, pendingJobs, open int
		err := e.pool.QueryRow(wctx, `SELECT
			(SELECT count(*) FROM staged_jobs),
			(SELECT count(*) FROM river_job WHERE state NOT IN ('completed', 'cancelled', 'discarded') AND queue <> $1),
			(SELECT count(*) FROM idempotency_keys k WHERE k.recovery_point <> 'finished'
				AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id))`, unworkedQueue).Scan(&staged, &pendingJobs, &open)
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("staged %d, River jobs not done %d, keys neither finished nor flagged %d", staged, pendingJobs, open)
		return staged == 0 && pendingJobs == 0 && open == 0, nil
	})
	if err != nil {
		e.t.Errorf("system did not settle within %s: %v; %s", settleWithin, err, last)
		return
	}
	e.logf("settled: %s", last)
}

// checkProcesses: every exit was one the harness caused, for the daemon
// set, Rocket Rides and the other long-running processes given.
func (e *env) checkProcesses(others ...*system.Proc) {
	var kills, unexpected int
	for _, p := range append(append(e.daemons.All(), e.rr.Proc), others...) {
		starts, k, u := p.Counts()
		kills += k
		unexpected += len(u)
		e.logf("%s: started %d times, SIGKILLed %d times by the suite, %d exits not caused by it %v", p.Name, starts, k, len(u), u)
		if len(u) > 0 {
			e.t.Errorf("%s exited by itself %d times (a restart loop): %v", p.Name, len(u), u)
		}
	}
	if kills == 0 {
		e.t.Error("the killer never killed anything")
	}
	st := e.proxy.Stats()
	e.logf("proxy: %d connections accepted, %d sockets severed", st.Accepted, st.Severed)
	e.logf("replay front: %s", e.front.summary())
}

// scanLogs fails the test on a panic or a Go runtime fatal error in any
// process's log: a daemon that crashed and was restarted by the killer in
// the same second would otherwise go unnoticed. others are processes
// outside the daemon set (one-shot runs).
func (e *env) scanLogs(others ...*system.Proc) {
	for _, p := range append(append(e.daemons.All(), e.rr.Proc), others...) {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			e.t.Errorf("%s: read log: %v", p.Name, err)
			continue
		}
		for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if i := strings.Index(string(b), bad); i >= 0 {
				e.t.Errorf("%s logged %q:\n%s", p.Name, bad, string(b[i:min(len(b), i+2000)]))
			}
		}
	}
}

func (e *env) status(ctx context.Context) {
	// idemctl status runs with the daemons' role (docs/operations.md).
	out, err := execOut(ctx, e.bins.Idemctl, "status", "--database-url", dbtest.RuntimeURL(e.dbURL), "--log-format", "console")
	if err != nil {
		e.t.Errorf("idemctl status: %v\n%s", err, out)
		return
	}
	e.t.Logf("idemctl status:\n%s", out)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

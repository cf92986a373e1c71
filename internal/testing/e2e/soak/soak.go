// Package soak runs idemd as a user runs it, for half an hour or more, and
// checks that nothing decays: the Rocket Rides API under steady traffic
// with injected faults and clients that give up, two enqueuers, a
// completer and the reaper as a scheduled Deployment, on a private
// PostgreSQL cluster at the server's default settings (autovacuum on).
// Every interval it samples each process's memory and goroutines, the
// sessions by application_name, the API's throughput, the watched tables'
// and indexes' sizes, dead tuples and autovacuums, the database's xmin
// horizon and the staged backlog; all along, internal/testing/horizon's
// sampler looks for an idemd session holding a snapshot longer than the
// bound. It ends by SIGKILLing the drainer enqueuer
// (the other one must take over), the oracle of the end-to-end suite
// (internal/testing/e2e/oracle) and the flatness checks (Flatness).
// TestSoak in internal/testing/e2e runs it (`make soak`); docs/benchmarks/soak.md
// says how to read its report.
package soak

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/oracle"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/horizon"
)

// Options tune a soak; zero values take the defaults.
type Options struct {
	// Duration of the traffic (default 30 min). The flatness checks' minute
	// marks scale with it.
	Duration time.Duration
	// Interval between samples (default Duration/60, within 5-30 s: every
	// 30 s for 30 minutes).
	Interval time.Duration
	// Clients: the simulator's closed-loop clients (default 8), each
	// sending its next ride when the last is answered.
	Clients int
	// FaultRate of the API's injected 500s, at any phase (default 0.02).
	FaultRate float64
	// GiveUpRate: the share of rides whose client walks away mid-request
	// (default 0.05).
	GiveUpRate float64
	// StripeLatency of the fake Stripe's charges (default 20 ms), so that
	// clients can give up mid-charge.
	StripeLatency time.Duration
	// Retention and ReaperEvery, the reaper's --retention and its
	// --schedule "@every ..." (default 2 min and 1 min for 30 minutes,
	// scaled down to at least 1 min and 10 s for shorter soaks): the
	// reaper is built with idemd_short_retention to accept them.
	Retention, ReaperEvery time.Duration
	// SnapshotBound: an idemd session may hold a snapshot (backend_xmin)
	// this long (default horizon.DefaultBound, the reaper's batch
	// statement timeout).
	SnapshotBound time.Duration
	// SamplesPath: where the samples are written as CSV (none when empty).
	SamplesPath string
	Logf        func(string, ...any)
}

func (o *Options) defaults() {
	if o.Duration <= 0 {
		o.Duration = 30 * time.Minute
	}
	if o.Interval <= 0 {
		o.Interval = min(max(o.Duration/60, 5*time.Second), 30*time.Second)
	}
	if o.Clients <= 0 {
		o.Clients = 8
	}
	if o.FaultRate == 0 {
		o.FaultRate = 0.02
	}
	if o.GiveUpRate == 0 {
		o.GiveUpRate = 0.05
	}
	if o.StripeLatency == 0 {
		o.StripeLatency = 20 * time.Millisecond
	}
	if o.Retention <= 0 {
		o.Retention = min(max(o.Duration/15, time.Minute), 2*time.Minute).Round(time.Second)
	}
	if o.ReaperEvery <= 0 {
		o.ReaperEvery = min(max(o.Duration/30, 10*time.Second), time.Minute).Round(time.Second)
	}
	if o.SnapshotBound <= 0 {
		o.SnapshotBound = horizon.DefaultBound
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// steady is when idempotency_keys has reached its steady size: minute 8
// of a 30-minute soak, and at least two of the reaper's runs after the
// first keys passed the retention.
func (o Options) steady() time.Duration {
	return max(mark(o.Duration, 8), o.Retention+2*o.ReaperEvery)
}

// The completer's waits, shortened with the reaper's retention: a key a
// client gave up is replayed within seconds, long before the reaper may
// delete it.
var completerArgs = []string{"--grace", "10s", "--idle", "5s", "--poll-interval", "2s",
	"--backoff-base", "1s", "--backoff-max", "20s", "--in-progress-delay", "5s"}

const completerGrace = 10 * time.Second

// The API's River worker: River fetches at most its free workers' worth of
// jobs every 100 ms (its fetch cooldown), so the example's default 10
// workers move at most about 100 receipts a second, fewer than the soak's
// paid rides; 50 keep up. Its jobs are one INSERT each: a few connections
// more than the clients serve them.
const (
	receiptWorkers = 50
	receiptConns   = 8
)

// Report is what a soak measured and found.
type Report struct {
	Options  Options
	Server   string // the server's version and settings
	Samples  []Sample
	Daemons  []string // the idemd processes, as in Samples' Procs
	Traffic  simulator.Stats
	Checks   []Check
	Snapshot horizon.Report
	Takeover Takeover
	Oracle   *oracle.Result
	// Problems are failures outside the checks: a process that exited by
	// itself, a daemon that did not exit 0 on SIGTERM, a panic in a log, a
	// system that did not settle.
	Problems []string
	Took     time.Duration
}

// Passed reports whether every check, the oracle and the processes passed.
func (r *Report) Passed() bool {
	for _, c := range r.Checks {
		if !c.Pass {
			return false
		}
	}
	return len(r.Problems) == 0 && r.Oracle != nil && r.Oracle.Passed()
}

// Takeover is the end of the soak: the drainer enqueuer SIGKILLed while
// the traffic runs.
type Takeover struct {
	Killed, Survivor string
	// ListenerUp: from the SIGKILL until the survivor's
	// idemd_enqueuer_listener_up read 1 (0: never within the deadline).
	ListenerUp time.Duration
	// FirstMoved: from the SIGKILL until the first row staged after it
	// was in River (by the survivor's sweep or as the new drainer).
	FirstMoved time.Duration
	// Resolution of both: the poll's period.
	Resolution time.Duration
}

// takeoverDeadline bounds the wait for the survivor.
const takeoverDeadline = 2 * time.Minute

// settleWithin bounds the wait for the system to drain after the traffic:
// keys whose client gave up mid-request stay locked for the API's 90 s lock
// timeout before the completer may replay them, and the API's River worker
// drains its backlog at its own pace.
const settleWithin = 10 * time.Minute

// Run builds the binaries, starts a private cluster, runs the soak and
// returns its report. An error is a soak that could not run or finish; a
// soak that ran and failed its checks returns a report that did not pass.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.defaults()
	started := time.Now()
	rep := &Report{Options: opts}
	cluster, err := dbtest.NewClusterWith(dbtest.ClusterOptions{Durable: true})
	if err != nil {
		return nil, fmt.Errorf("soak: private cluster: %w", err)
	}
	defer cluster.Remove()
	dir, err := os.MkdirTemp("", "idemd-soak-")
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer os.RemoveAll(dir)
	bins, err := system.BuildTags(ctx, filepath.Join(dir, "bin"), "idemd_short_retention")
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer system.CloseIdleConnections()
	dbURL, _, err := system.CreateDatabase(ctx, cluster.URL(), bins, "idemd_soak")
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	r := &run{opts: opts, rep: rep, bins: bins, dir: dir, dbURL: dbURL}
	defer r.close()
	err = r.soak(ctx)
	rep.Took = time.Since(started)
	if err != nil || !rep.Passed() {
		r.tails(cluster.LogPath())
	}
	return rep, err
}

// run is one soak's state.
type run struct {
	opts  Options
	rep   *Report
	bins  *system.Binaries
	dir   string
	dbURL string

	admin     *pgxpool.Pool
	rr        *system.RocketRides
	enqueuers []*system.Proc
	completer *system.Proc
	reaper    *system.Proc
	closers   []func()
}

func (r *run) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

func (r *run) daemons() []*system.Proc {
	return append(append([]*system.Proc(nil), r.enqueuers...), r.completer, r.reaper)
}

func (r *run) soak(ctx context.Context) error {
	o := r.opts
	adminURL, err := withParams(r.dbURL, "application_name", samplerAppName, "pool_max_conns", "4")
	if err != nil {
		return err
	}
	if r.admin, err = pgxpool.New(ctx, adminURL); err != nil {
		return fmt.Errorf("soak: admin pool: %w", err)
	}
	r.closers = append(r.closers, r.admin.Close)
	if err := r.admin.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version') || ', autovacuum ' || current_setting('autovacuum') ||
		', autovacuum_naptime ' || current_setting('autovacuum_naptime') || ', shared_buffers ' || current_setting('shared_buffers') ||
		', max_connections ' || current_setting('max_connections') || ', fsync ' || current_setting('fsync')`).Scan(&r.rep.Server); err != nil {
		return fmt.Errorf("soak: server settings: %w", err)
	}
	if err := r.start(ctx); err != nil {
		return err
	}
	riders, err := system.Riders(ctx, r.admin, 20, 1)
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if err := r.rr.SetFaults(ctx, api.FaultRule{Rate: o.FaultRate, Kind: api.FaultInternal}); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	indexes, err := indexNames(ctx, r.admin)
	if err != nil {
		return err
	}
	r.rep.Daemons = nil
	for _, p := range r.daemons() {
		r.rep.Daemons = append(r.rep.Daemons, p.Name)
	}
	cols := columns{procs: append(append([]string(nil), r.rep.Daemons...), r.rr.Name), indexes: indexes}
	var out *csvWriter
	if o.SamplesPath != "" {
		f, err := os.Create(o.SamplesPath)
		if err != nil {
			return fmt.Errorf("soak: samples: %w", err)
		}
		defer f.Close()
		if out, err = newCSVWriter(f, cols); err != nil {
			return err
		}
	}

	// Every idemd session (by application_name, and by the daemons' role)
	// is held to the bound from the start of the traffic to the end of the
	// settling.
	watch := horizon.Start(ctx, r.admin, horizon.Options{Bound: o.SnapshotBound, Roles: []string{dbtest.RuntimeRole}, Logf: o.Logf})
	snapshotsStopped := false
	defer func() {
		if !snapshotsStopped {
			watch.Stop()
		}
	}()

	// The traffic runs until the takeover has been measured.
	rec := &recorder{next: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: rec}
	defer client.CloseIdleConnections()
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	trafficDone := make(chan error, 1)
	smp := &sampler{admin: r.admin, procs: r.daemons(), api: r.rr, reaper: r.reaper, clients: rec, start: time.Now()}
	go func() {
		st, err := simulator.Run(trafficCtx, simulator.Config{
			BaseURL: r.rr.APIURL, APIKeys: riders, Concurrency: o.Clients, Duration: o.Duration + takeoverDeadline + time.Minute,
			GiveUpRate: o.GiveUpRate, GiveUpAfter: 60 * time.Millisecond, MaxRetries: 2, HTTPClient: client,
		})
		r.rep.Traffic = st
		if errors.Is(err, context.Canceled) {
			err = nil // stopped after the takeover
		}
		trafficDone <- err
	}()
	o.Logf("soak: %s of traffic (%d clients, %.0f %% faults, %.0f %% give up), a sample every %s; %s", o.Duration, o.Clients, 100*o.FaultRate, 100*o.GiveUpRate, o.Interval, lineHeader(r.rep.Daemons))
	// A sample at the start and every interval; the last one is the first
	// taken at or after the duration (less half an interval for the
	// ticker's jitter).
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		s, err := smp.sample(ctx)
		if err != nil {
			return err
		}
		r.rep.Samples = append(r.rep.Samples, s)
		o.Logf("soak: %s", line(s, r.rep.Daemons))
		if out != nil {
			if err := out.write(s); err != nil {
				return err
			}
		}
		if err := r.exited(); err != nil {
			return err
		}
		if s.At >= o.Duration-o.Interval/2 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-trafficDone:
			return fmt.Errorf("soak: traffic ended early: %v", err)
		case <-tick.C:
		}
	}
	r.rep.Checks = Flatness(r.rep.Samples, o.Duration, o.steady(), r.rep.Daemons)

	if err := r.takeover(ctx); err != nil {
		return err
	}
	stopTraffic()
	if err := <-trafficDone; err != nil {
		r.problem("simulator: %v", err)
	}
	o.Logf("soak: traffic: %s", r.rep.Traffic)
	if r.rep.Traffic.Rejected > 0 {
		r.problem("%d requests rejected with a 4xx other than 402/409: the simulator or the API is broken", r.rep.Traffic.Rejected)
	}
	if err := r.rr.SetFaults(ctx); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	r.settle(ctx)
	snapshotsStopped = true
	r.rep.Snapshot = watch.Stop()
	r.rep.Checks = append(r.rep.Checks, snapshotCheck(r.rep.Snapshot, o.SnapshotBound))
	r.stopDaemons()
	charges, err := r.rr.Charges(ctx)
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if r.rep.Oracle, err = oracle.Check(ctx, r.admin, charges, oracle.Options{Grace: completerGrace}); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	r.scanLogs()
	return nil
}

// start starts the API and the daemons and waits until every enqueuer is
// the drainer or a standby.
func (r *run) start(ctx context.Context) error {
	o := r.opts
	secretPath, _, err := system.WriteSecret(r.dir, "replay-secret")
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	// The API's sessions carry an application_name of their own (its
	// default, idemd-rocketrides, would count as idemd's); its pool has a
	// connection per client and receiptConns more for its River worker.
	apiURL, err := withParams(r.dbURL, "application_name", apiAppName, "pool_max_conns", fmt.Sprint(o.Clients+receiptConns))
	if err != nil {
		return err
	}
	if r.rr, err = system.StartRocketRides(ctx, r.bins, system.RocketRidesOptions{
		DatabaseURL: apiURL, SecretFile: secretPath, StripeLatency: o.StripeLatency, Dir: r.dir,
		ExtraArgs: []string{"--receipt-workers", fmt.Sprint(receiptWorkers)},
	}); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	r.closers = append(r.closers, r.rr.Close)
	if err := oracle.InstallStagedLog(ctx, r.admin); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	runtimeURL := dbtest.RuntimeURL(r.dbURL)
	start := func(name, bin string, args ...string) (*system.Proc, error) {
		var p *system.Proc
		err := system.StartRetrying(func() (*system.Proc, error) {
			addr, err := system.FreeAddr()
			if err != nil {
				return nil, err
			}
			a := append([]string{"--database-url", runtimeURL, "--log-format", "console", "--http-addr", addr}, args...)
			p = &system.Proc{Name: name, Bin: bin, Args: a, OpsAddr: addr, LogPath: filepath.Join(r.dir, name+".log")}
			return p, nil
		}, func(p *system.Proc) error { return system.WaitReady(ctx, p) })
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		r.closers = append(r.closers, p.Close)
		return p, nil
	}
	for i := range 2 {
		p, err := start(fmt.Sprintf("enqueuer-%d", i+1), r.bins.Enqueuer)
		if err != nil {
			return err
		}
		r.enqueuers = append(r.enqueuers, p)
	}
	if r.completer, err = start("completer-1", r.bins.Completer, append([]string{"--api-url", r.rr.APIURL, "--auth-secret-file", secretPath}, completerArgs...)...); err != nil {
		return err
	}
	if r.reaper, err = start("reaper", r.bins.Reaper, "--schedule", "@every "+o.ReaperEvery.String(), "--retention", o.Retention.String()); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, p := range r.enqueuers {
		if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
			m, err := metrics(wctx, p)
			if err != nil {
				return false, err
			}
			return value(m, "idemd_enqueuer_listener_up", nil) == 1 || value(m, "idemd_enqueuer_standby", nil) == 1, nil
		}); err != nil {
			return fmt.Errorf("soak: %s is neither the drainer nor a standby: %w\n%s", p.Name, err, p.LogTail(3000))
		}
	}
	return nil
}

// takeover SIGKILLs the enqueuer that is the drainer while the traffic
// runs and measures how long until the other one is (its listener_up 1)
// and until a row staged after the kill is in River; then it starts the
// killed one again, as its Deployment would.
func (r *run) takeover(ctx context.Context) error {
	const every = 20 * time.Millisecond
	wctx, cancel := context.WithTimeout(ctx, takeoverDeadline)
	defer cancel()
	var drainer, survivor *system.Proc
	if err := system.Poll(wctx, every, func() (bool, error) {
		for i, p := range r.enqueuers {
			m, err := metrics(wctx, p)
			if err != nil {
				return false, err
			}
			if value(m, "idemd_enqueuer_listener_up", nil) == 1 {
				drainer, survivor = p, r.enqueuers[1-i]
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("soak: no enqueuer is the drainer: %w", err)
	}
	var lastStaged, lastJob int64
	if err := r.admin.QueryRow(ctx, `SELECT (SELECT coalesce(max(id), 0) FROM e2e_staged_log), (SELECT coalesce(max(id), 0) FROM river_job)`).Scan(&lastStaged, &lastJob); err != nil {
		return fmt.Errorf("soak: takeover: %w", err)
	}
	tk := Takeover{Killed: drainer.Name, Survivor: survivor.Name, Resolution: every}
	killed := time.Now()
	if err := drainer.Kill(); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	err := system.Poll(wctx, every, func() (bool, error) {
		if tk.ListenerUp == 0 {
			m, err := metrics(wctx, survivor)
			if err != nil {
				return false, err
			}
			if value(m, "idemd_enqueuer_listener_up", nil) == 1 {
				tk.ListenerUp = time.Since(killed)
			}
		}
		if tk.FirstMoved == 0 {
			var moved bool
			if err := r.admin.QueryRow(wctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE id > $1 AND (metadata->>'idemd_staged_id')::bigint > $2)`, lastJob, lastStaged).Scan(&moved); err != nil {
				return false, err
			}
			if moved {
				tk.FirstMoved = time.Since(killed)
			}
		}
		return tk.ListenerUp > 0 && tk.FirstMoved > 0, nil
	})
	r.rep.Takeover = tk
	c := Check{
		Name:   "takeover after SIGKILL of the drainer",
		Value:  fmt.Sprintf("%s killed; %s the drainer (listener_up 1) after %s, first row staged after the kill in River after %s (polled every %s)", tk.Killed, tk.Survivor, tk.ListenerUp.Round(time.Millisecond), tk.FirstMoved.Round(time.Millisecond), every),
		Target: fmt.Sprintf("both within %s", takeoverDeadline),
		Pass:   err == nil,
	}
	if err != nil {
		c.Value += fmt.Sprintf("; %v", err)
	}
	r.rep.Checks = append(r.rep.Checks, c)
	r.opts.Logf("soak: %s", c)
	if err := drainer.Start(); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if err := system.WaitReady(ctx, drainer); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	return nil
}

// settle waits until nothing is staged, every River job is worked and
// every key is finished or flagged.
func (r *run) settle(ctx context.Context) {
	wctx, cancel := context.WithTimeout(ctx, settleWithin)
	defer cancel()
	var last string
	err := system.Poll(wctx, time.Second, func() (bool, error) {
		var staged, pending, open int
		if err := r.admin.QueryRow(wctx, `SELECT
			(SELECT count(*) FROM staged_jobs),
			(SELECT count(*) FROM river_job WHERE state NOT IN ('completed', 'cancelled', 'discarded')),
			(SELECT count(*) FROM idempotency_keys k WHERE k.recovery_point <> 'finished'
				AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id))`).Scan(&staged, &pending, &open); err != nil {
			return false, err
		}
		last = fmt.Sprintf("staged %d, River jobs not done %d, keys neither finished nor flagged %d", staged, pending, open)
		return staged == 0 && pending == 0 && open == 0, nil
	})
	if err != nil {
		r.problem("the system did not settle within %s: %v; %s", settleWithin, err, last)
		return
	}
	r.opts.Logf("soak: settled: %s", last)
}

// exited fails the soak on a process exit the soak did not cause.
func (r *run) exited() error {
	for _, p := range append(r.daemons(), r.rr.Proc) {
		if _, _, u := p.Counts(); len(u) > 0 {
			return fmt.Errorf("soak: %s exited by itself: %v\n%s", p.Name, u, p.LogTail(3000))
		}
	}
	return nil
}

// stopDaemons stops the daemons with SIGTERM; each must exit 0.
func (r *run) stopDaemons() {
	for _, p := range r.daemons() {
		if !p.Running() {
			continue
		}
		code, err := p.Stop(30 * time.Second)
		if err != nil || code != 0 {
			r.problem("%s exited %d on SIGTERM (%v), want 0", p.Name, code, err)
		}
	}
	for _, p := range append(r.daemons(), r.rr.Proc) {
		if _, _, u := p.Counts(); len(u) > 0 {
			r.problem("%s exited by itself: %v", p.Name, u)
		}
	}
}

// scanLogs: no panic or Go runtime fatal error in any process's log.
func (r *run) scanLogs() {
	for _, p := range append(r.daemons(), r.rr.Proc) {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			r.problem("%s: read log: %v", p.Name, err)
			continue
		}
		for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if i := strings.Index(string(b), bad); i >= 0 {
				r.problem("%s logged %q:\n%s", p.Name, bad, string(b[i:min(len(b), i+2000)]))
			}
		}
	}
}

// tails logs the end of every process's log and the server's, for a soak
// that failed.
func (r *run) tails(serverLog string) {
	for _, p := range r.daemons() {
		if p != nil {
			r.opts.Logf("---- tail of %s\n%s", p.Name, p.LogTail(3000))
		}
	}
	if r.rr != nil {
		r.opts.Logf("---- tail of %s\n%s", r.rr.Name, r.rr.LogTail(3000))
	}
	if b, err := os.ReadFile(serverLog); err == nil {
		r.opts.Logf("---- PostgreSQL log tail\n%s", b[max(0, len(b)-3000):])
	}
}

func (r *run) problem(format string, args ...any) {
	p := fmt.Sprintf(format, args...)
	r.rep.Problems = append(r.rep.Problems, p)
	r.opts.Logf("soak: problem: %s", p)
}

// snapshotCheck is the horizon sampler's verdict.
func snapshotCheck(s horizon.Report, bound time.Duration) Check {
	c := Check{
		Name:   "idemd sessions holding a snapshot",
		Target: fmt.Sprintf("none longer than %s", bound),
		Pass:   s.Err() == nil,
	}
	c.Value = fmt.Sprintf("%d violations in %d readings (%d failed); the longest hold %s (%s); the oldest backend_xmin seen %d transactions (%s)",
		len(s.Violations), s.Samples, s.Errors, s.LongestIdemd.Round(time.Millisecond), orNone(s.LongestIdemdHolder), s.MaxHorizonAge, orNone(s.MaxHorizonAgeHolder))
	return c
}

// withParams returns the connection URL u with the query parameters kv
// (name, value, ...).
func withParams(u string, kv ...string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("soak: database URL: %w", err)
	}
	q := parsed.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

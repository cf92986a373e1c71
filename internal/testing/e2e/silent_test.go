//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/horizon"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
)

// The faults that say nothing (issue 48): a black-holed network, a frozen
// database, a slow link and a half-open connection, one after another on
// one running system. Each fault's length is IDEMD_E2E_SILENCE (default
// 60s); CI may shorten it.
const silenceEnv = "IDEMD_E2E_SILENCE"

// Deadlines that say "recovers by itself", not how fast: a daemon that has
// not moved again within recoverWithin of a fault's end waits on something
// only a restart would end.
const (
	recoverWithin = 2 * time.Minute
	// levelWithin bounds the wait for goroutines and sessions to come back
	// to their level after the recovery.
	levelWithin = 2 * time.Minute
)

// Back to its level (docs/e2e.md, "Silent faults"). Goroutines: what a
// daemon runs in a quiet moment varies by a few with what its loops do at
// the moment of the sample (a pass in flight, a scrape's connection), and
// the poll waits out the bursts a fault leaves (the keys abandoned during
// it are replayed at once), while a leak of the fault grows with its
// attempts (a pass retried every few seconds, a connection dialed per
// attempt: dozens over a minute). Sessions: a pool keeps the connections a burst opened, up to
// its pool_max_conns, for pgxpool's MaxConnIdleTime (30 minutes), so a
// daemon's sessions after a fault may stay above the steady state's
// without a leak; what a leak looks like is more sessions than its pools
// and its own connections can hold, or a session whose client is gone
// (orphan: no connection of the proxy forwards to it).
const goroutineSlack = 10 // per process, above the highest baseline sample

// dedicatedSessions are a daemon's connections outside its pool: the
// enqueuer's listener and its polling lock's session.
var dedicatedSessions = map[string]int{"enqueuer": 2}

// sessionBound is the most sessions the replicas of daemon may hold:
// each its pool's pool_max_conns, pgxpool's default max(4, NumCPU) (the
// daemons run at their defaults on this machine), and its own connections.
func sessionBound(daemon string, replicas int) int {
	return replicas * (max(4, runtime.NumCPU()) + dedicatedSessions[daemon])
}

// Load of the runs: staged rows a second in the steady state and on the
// slow link, and a new abandoned key every keyEvery.
const (
	baseRate = 100
	slowRate = 1000
	keyEvery = 2 * time.Second
	// slowLatency is added each way on the slow link.
	slowLatency = 50 * time.Millisecond
)

func silence(t *testing.T) time.Duration {
	v := os.Getenv(silenceEnv)
	if v == "" {
		return time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("%s=%q: want a duration of at least 10s", silenceEnv, v)
	}
	return d
}

// TestSilentFaults runs two enqueuers, one completer and a scheduled reaper
// at their defaults, reaching PostgreSQL through the proxy, while the test
// stages rows and abandons keys directly, through four silent faults; after
// each, every daemon must move again by itself and its goroutines and
// sessions come back to their level; at the end, the oracle.
func TestSilentFaults(t *testing.T) {
	hold := silence(t)
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	e, opts := prepare(ctx, t, false)
	defer system.CloseIdleConnections()
	opts.Enqueuers, opts.Completers, opts.Reaper = 2, 1, true
	opts.AtDefaults, opts.ReaperSchedule = true, "@every 10s"
	e.startDaemons(ctx, opts)
	// No idemd session holds a snapshot longer than the bound through
	// any silent fault either (docs/design.md, invariant 7); the frozen
	// server answers no sample while it is stopped.
	hz := horizon.Start(ctx, e.pool, horizon.Options{Roles: []string{dbtest.RuntimeRole}, Logf: e.logf})
	e.poison = []int64{} // none; an empty array, not NULL, for the oracle's <> ALL
	e.logf("silent faults: %s each, daemons at their defaults through proxy %s", hold, e.proxy.Addr())

	s := &silentRun{env: e, hold: hold, ready: newReadyWatch(e.daemons.All())}
	if err := e.seedOldKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.createUser(ctx); err != nil {
		t.Fatal(err)
	}
	s.ready.start(ctx)
	defer s.ready.stop()
	s.load = startLoad(ctx, e.pool, s.abandon)
	defer s.load.stop()

	s.warmUp(ctx)
	s.base = s.baseline(ctx)
	s.blackHole(ctx)
	s.freeze(ctx)
	s.slowLink(ctx)
	s.halfOpen(ctx)

	st := s.load.stop()
	e.logf("load: %s", st)
	if st.committed == 0 || st.keys == 0 {
		t.Errorf("the load staged %d rows and abandoned %d keys: nothing was exercised", st.committed, st.keys)
	}
	e.settle(ctx)
	s.checkProcesses()
	stopDaemons(t, e.daemons, "silent run's")
	e.oracle(ctx, simulator.Stats{})
	e.checkHorizon(hz.Stop())
	if locks, err := dbtest.AdvisoryLocks(ctx, e.pool); err != nil || locks != 0 {
		t.Errorf("advisory locks held after the run: %d (%v)", locks, err)
	}
	e.scanLogs()
	s.ready.stop()
	s.report()
	t.Logf("silent faults took %s", time.Since(started).Round(time.Second))
	if t.Failed() {
		for _, p := range append(e.daemons.All(), e.rr.Proc) {
			t.Logf("---- tail of %s\n%s", p.Name, p.LogTail(3000))
		}
	}
}

// silentRun is one run of the silent faults.
type silentRun struct {
	*env
	hold  time.Duration
	ready *readyWatch
	load  *silentLoad
	user  int64
	keyN  atomic.Int64
	base  level

	// restarted names the processes the run dumped and started again (a
	// failed recovery): their goroutines start from nothing.
	restarted map[string]bool
	reports   []*faultReport
}

// faultReport is what one fault measured.
type faultReport struct {
	name       string
	start, end time.Time
	// notReady: from the fault's start to each daemon's first answer other
	// than 200 from /readyz (absent: ready throughout).
	notReady map[string]time.Duration
	// warnings: WARN and ERROR lines each daemon logged while the fault
	// lasted, and the distinct messages among them.
	warnings map[string]int
	messages map[string]map[string]int
	// moving: from the fault's end until each kind of work moved again.
	moving map[string]time.Duration
	// before and after are the levels around the fault.
	before, after level
	notes         []string
}

func (s *silentRun) newReport(name string) *faultReport {
	r := &faultReport{name: name, notReady: map[string]time.Duration{}, warnings: map[string]int{},
		messages: map[string]map[string]int{}, moving: map[string]time.Duration{}}
	s.reports = append(s.reports, r)
	return r
}

func (r *faultReport) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// createUser is the rider whose requests the test abandons.
func (s *silentRun) createUser(ctx context.Context) error {
	return s.pool.QueryRow(ctx, `INSERT INTO users (email, stripe_customer_id, api_key_sha256)
		VALUES ('e2e-silent@example.com', 'cus_e2e_silent', 'e2e-silent-key') RETURNING id`).Scan(&s.user)
}

// abandon inserts a POST /rides key as a request would leave it that died
// after its first phase began and never came back, already past the
// completer's default --grace and --idle (by the database clock) so that
// it is due at once; the completer replays it through the front to the
// API. It returns the key's id.
func (s *silentRun) abandon(ctx context.Context) (int64, error) {
	age := completer.DefaultSettings().Grace + 10*time.Second
	var id int64
	err := s.pool.QueryRow(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
    request_path, recovery_point, user_id, upstream_idempotency_key)
VALUES (now() - $1::interval, $2, now() - $1::interval, NULL, 'POST',
    '{"origin_lat":37.7,"origin_lon":-122.4,"target_lat":37.8,"target_lon":-122.5}', '/rides', 'started', $3, gen_random_uuid())
RETURNING id`, age, fmt.Sprintf("e2e-silent-%d", s.keyN.Add(1)), s.user).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("abandon a key: %w", err)
	}
	return id, nil
}

// blackHole: for hold, every daemon connection stops forwarding and every
// new one is held; halfway, the server's side of each silenced connection
// closes (as PostgreSQL's keepalives would end the sessions). Then the
// network comes back.
func (s *silentRun) blackHole(ctx context.Context) {
	r := s.newReport("black hole")
	r.before = s.base
	mark := s.logMarks()
	r.start = time.Now()
	n := s.proxy.BlackHole(tcpproxy.HoleOptions{CloseServerAfter: s.hold / 2})
	s.logf("black hole: %d connections silenced, new ones held; server sides close after %s", n, s.hold/2)
	s.ready.open(r)
	sleep(ctx, time.Until(r.start.Add(s.hold)))
	s.proxy.Heal()
	r.end = s.ready.close()
	st := s.proxy.Stats()
	s.logf("black hole healed: %d silenced, %d held, %d server sides closed, %d bytes dropped", st.Silenced, st.Held, st.ServerClosed, st.Dropped)
	s.countWarnings(r, mark)
	s.saidNotReady(r)
	s.recover(ctx, r)
}

// freeze: the cluster's postmaster and every backend SIGSTOPped for hold,
// then SIGCONT.
func (s *silentRun) freeze(ctx context.Context) {
	r := s.newReport("frozen database")
	r.before = s.levelNow(ctx)
	mark := s.logMarks()
	r.start = time.Now()
	thaw, n, err := s.cluster.Freeze()
	if err != nil {
		s.t.Fatalf("freeze: %v", err)
	}
	thawed := false
	defer func() {
		if !thawed {
			thaw() //nolint:errcheck // a failed test must not leave the cluster stopped
		}
	}()
	s.logf("PostgreSQL frozen: %d processes stopped", n)
	s.ready.open(r)
	sleep(ctx, time.Until(r.start.Add(s.hold)))
	thawed = true
	if err := thaw(); err != nil {
		s.t.Fatalf("thaw: %v", err)
	}
	r.end = s.ready.close()
	s.logf("PostgreSQL thawed")
	s.countWarnings(r, mark)
	s.saidNotReady(r)
	s.recover(ctx, r)
}

// slowLink: slowLatency each way on every daemon connection for hold,
// while the load stages slowRate rows a second; every committed row's time
// from its commit to its River job is measured.
func (s *silentRun) slowLink(ctx context.Context) {
	r := s.newReport("slow link")
	r.before = s.levelNow(ctx)
	mark := s.logMarks()
	s.load.setRate(slowRate)
	s.load.record(true)
	r.start = time.Now()
	s.proxy.SetLatency(slowLatency)
	s.logf("proxy: %s each way, staging %d rows/s", slowLatency, slowRate)
	backlog := s.sampleBacklog(ctx)
	s.ready.open(r)
	sleep(ctx, time.Until(r.start.Add(s.hold)))
	s.proxy.SetLatency(0)
	r.end = s.ready.close()
	commits := s.load.record(false)
	s.load.setRate(baseRate)
	peak := backlog()
	s.logf("proxy: latency off")
	s.countWarnings(r, mark)
	r.note("staged %d rows in %s (%.0f/s); backlog peaked at %d rows", len(commits), s.hold, float64(len(commits))/s.hold.Seconds(), peak)

	// Every row committed on the slow link reaches River (by itself, within
	// the recovery deadline); then its latency.
	lat, err := s.toRiver(ctx, commits)
	if err != nil {
		s.t.Errorf("slow link: %v", err)
	} else if len(lat) > 0 {
		r.note("commit → River: p50 %s, p99 %s, max %s over %d rows", pct(lat, 0.5), pct(lat, 0.99), lat[len(lat)-1], len(lat))
	}
	s.recover(ctx, r)
}

// halfOpen: the server's side of the drainer's listener connection (the
// session holding the drainer lock) closes, and the drainer hears nothing
// of it. The drainer lock must be held again by a live session with the
// other enqueuer standing by on one, the old drainer must find its
// listener dead, and staged rows must keep moving. Who takes over is
// measured: the standby, trying for the lock every --takeover-interval,
// gets it once the server has ended the old session.
func (s *silentRun) halfOpen(ctx context.Context) {
	r := s.newReport("half-open drainer connection")
	r.before = s.levelNow(ctx)
	drainer, standby, err := s.drainerAndStandby(ctx)
	if err != nil {
		s.t.Errorf("half-open: %v", err)
		return
	}
	port, err := s.drainerClientPort(ctx)
	if err != nil {
		s.t.Errorf("half-open: %v", err)
		return
	}
	takeovers := s.counter(ctx, standby, "idemd_enqueuer_drainer_takeovers_total", nil)
	checkFailures := s.counter(ctx, drainer, "idemd_enqueuer_listener_check_failures_total", nil)
	mark := s.logMarks()
	r.start = time.Now()
	n := s.proxy.HalfOpen(func(c tcpproxy.Conn) bool { return c.Server.(*net.TCPAddr).Port == port })
	if n != 1 {
		s.t.Errorf("half-open: %d connections matched the drainer session's port %d, want 1", n, port)
		return
	}
	s.ready.open(r)
	s.logf("half-open: the server side of %s's listener (port %d) closed, its client side silent", drainer.Name, port)

	wctx, cancel := context.WithTimeout(ctx, recoverWithin)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	moved := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.t.Errorf("half-open: %s did not happen within %s: %v", what, recoverWithin, err)
			return
		}
		r.moving[what] = time.Since(r.start)
	}
	poll := func(what string, cond func() (bool, error)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			moved(what, system.Poll(wctx, 100*time.Millisecond, cond))
		}()
	}
	poll("drainer lock held by a live session", func() (bool, error) {
		held, _, err := s.drainerSessions(wctx)
		return held, err
	})
	poll(drainer.Name+" found its listener dead", func() (bool, error) {
		return s.counter(wctx, drainer, "idemd_enqueuer_listener_check_failures_total", nil) > checkFailures, nil
	})
	poll("one drainer, the other standing by on a live session", func() (bool, error) { return s.electionWhole(wctx) })
	wg.Add(1)
	go func() {
		defer wg.Done()
		moved("staged job in River", s.stagedReachesRiver(wctx))
	}()
	wg.Wait()
	if s.counter(ctx, standby, "idemd_enqueuer_drainer_takeovers_total", nil) > takeovers {
		r.note("%s (the standby) took over", standby.Name)
	} else {
		r.note("%s (the old drainer) took the lock again", drainer.Name)
	}
	// The connection stays half-open; the fault's window ends with the
	// recovery.
	r.end = s.ready.close()
	s.countWarnings(r, mark)
	s.backToLevel(ctx, r)
}

// drainerSessions reads the enqueuers' lock sessions: held is true when
// the drainer lock is held by a session on a connection the proxy
// forwards; standingBy counts the other sessions on such connections whose
// last statement was an attempt at the lock (a standby tries for it every
// --takeover-interval, with a statement that returns at once).
func (s *silentRun) drainerSessions(ctx context.Context) (held bool, standingBy int, err error) {
	live := map[int]bool{}
	for _, c := range s.proxy.Conns() {
		live[c.Server.(*net.TCPAddr).Port] = true
	}
	rows, err := s.pool.Query(ctx, drainerLockSQL)
	if err != nil {
		return false, 0, err
	}
	var granted bool
	var port int
	holders := map[int]bool{}
	if _, err := pgx.ForEachRow(rows, []any{&granted, &port}, func() error {
		if granted {
			holders[port] = true
			held = held || live[port]
		}
		return nil
	}); err != nil {
		return false, 0, err
	}
	rows, err = s.pool.Query(ctx, `SELECT coalesce(client_port, -1) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE $1`, "%pg_try_advisory_lock(hashtextextended('idemd enqueuer drainer '%")
	if err != nil {
		return false, 0, err
	}
	_, err = pgx.ForEachRow(rows, []any{&port}, func() error {
		if live[port] && !holders[port] {
			standingBy++
		}
		return nil
	})
	return held, standingBy, err
}

// electionWhole: exactly one enqueuer is the drainer (listener_up) and
// the others stand by, the drainer lock is held by a live session and
// every standby tries for it on one. A standby whose session went silent
// says it stands by, and would never take over: only the server's view
// tells.
func (s *silentRun) electionWhole(ctx context.Context) (bool, error) {
	drainers, standbys := 0, 0
	for _, p := range s.daemons.Enqueuers {
		if s.gauge(ctx, p, "idemd_enqueuer_listener_up") == 1 {
			drainers++
		}
		if s.gauge(ctx, p, "idemd_enqueuer_standby") == 1 {
			standbys++
		}
	}
	if drainers != 1 || standbys != len(s.daemons.Enqueuers)-1 {
		return false, fmt.Errorf("%d drainers and %d standbys", drainers, standbys)
	}
	held, standingBy, err := s.drainerSessions(ctx)
	if err != nil {
		return false, err
	}
	if !held || standingBy != standbys {
		return false, fmt.Errorf("drainer lock held by a live session: %v; %d of %d standbys trying for it on live sessions", held, standingBy, standbys)
	}
	return true, nil
}

// saidNotReady: every daemon's /readyz said, at least once while the fault
// lasted, that it was not ready (when is measured, not asserted): a
// daemon that cannot reach its database must not be counted as serving.
func (s *silentRun) saidNotReady(r *faultReport) {
	for _, p := range s.daemons.All() {
		if _, ok := r.notReady[p.Name]; !ok {
			s.t.Errorf("%s: %s answered /readyz 200 throughout the fault", r.name, p.Name)
		}
	}
}

// recover measures, from the fault's end, how long until each kind of work
// moves again and each daemon is ready; a daemon that has not within
// recoverWithin fails the test, and its goroutines are dumped (SIGQUIT) to
// show where it waits before it is started again for the next fault. Then
// goroutines and sessions must come back to their level.
func (s *silentRun) recover(ctx context.Context, r *faultReport) {
	wctx, cancel := context.WithTimeout(ctx, recoverWithin)
	defer cancel()
	reaperRuns := s.counter(wctx, s.daemons.Reaper, "idemd_reaper_runs_total", map[string]string{"result": "complete"})
	var mu sync.Mutex
	stuck := map[*system.Proc]bool{}
	var wg sync.WaitGroup
	// moved records that what moved now.
	moved := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		r.moving[what] = time.Since(r.end)
	}
	probe := func(what string, blame []*system.Proc, wait func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := wait(); err != nil {
				mu.Lock()
				defer mu.Unlock()
				s.t.Errorf("%s: %s did not happen within %s of the fault's end: %v", r.name, what, recoverWithin, err)
				for _, p := range blame {
					stuck[p] = true
				}
				return
			}
			moved(what)
		}()
	}
	probe("staged job in River", s.daemons.Enqueuers, func() error { return s.stagedReachesRiver(wctx) })
	probe("drainer and standby on live sessions", s.daemons.Enqueuers, func() error {
		return system.Poll(wctx, 100*time.Millisecond, func() (bool, error) { return s.electionWhole(wctx) })
	})
	probe("new key finished", s.daemons.Completers, func() error { return s.keyMoves(wctx, func() { moved("new key claimed") }) })
	probe("reaper run complete", []*system.Proc{s.daemons.Reaper}, func() error {
		return system.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
			return s.counter(wctx, s.daemons.Reaper, "idemd_reaper_runs_total", map[string]string{"result": "complete"}) > reaperRuns, nil
		})
	})
	for _, p := range s.daemons.All() {
		probe("ready "+p.Name, []*system.Proc{p}, func() error {
			return system.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
				ok, _ := p.Ready(wctx)
				return ok, nil
			})
		})
	}
	wg.Wait()
	for p := range stuck {
		s.dump(ctx, p)
	}
	s.backToLevel(ctx, r)
}

// keyMoves abandons a key now and waits until the completer claims it
// (then it calls claimed) and finishes it.
func (s *silentRun) keyMoves(ctx context.Context, claimed func()) error {
	var id int64
	if err := system.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var err error
		id, err = s.abandon(qctx)
		return err == nil, err
	}); err != nil {
		return err
	}
	if err := system.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		var ok bool
		err := s.pool.QueryRow(ctx, `SELECT completer_leased_until IS NOT NULL OR recovery_point = 'finished'
			FROM idempotency_keys WHERE id = $1`, id).Scan(&ok)
		return ok, err
	}); err != nil {
		return fmt.Errorf("not claimed: %w", err)
	}
	claimed()
	if err := system.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		var finished bool
		err := s.pool.QueryRow(ctx, `SELECT recovery_point = 'finished' FROM idempotency_keys WHERE id = $1`, id).Scan(&finished)
		return finished, err
	}); err != nil {
		return fmt.Errorf("claimed, not finished: %w", err)
	}
	return nil
}

// stagedReachesRiver stages one row directly (retrying until it commits:
// after a freeze the database may still be waking) and waits for its River
// job.
func (s *silentRun) stagedReachesRiver(ctx context.Context) error {
	var id int64
	if err := system.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ids, err := stageRows(qctx, s.pool, 1, false)
		if err != nil {
			return false, err
		}
		id = ids[0]
		return true, nil
	}); err != nil {
		return err
	}
	return system.Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		var in bool
		err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE queue = $1 AND metadata->>'idemd_staged_id' = $2)`,
			unworkedQueue, strconv.FormatInt(id, 10)).Scan(&in)
		return in, err
	})
}

// dump writes a stuck daemon's goroutines to its log (SIGQUIT), logs the
// database calls they wait in, and starts it again.
func (s *silentRun) dump(ctx context.Context, p *system.Proc) {
	from, err := p.Dump(10 * time.Second)
	if err != nil {
		s.t.Errorf("dump %s: %v", p.Name, err)
	}
	b, err := os.ReadFile(p.LogPath)
	if err == nil && int64(len(b)) > from {
		calls := stuckCalls(string(b[from:]))
		s.logf("%s was stuck; its goroutines in database calls (SIGQUIT):\n  %s", p.Name, strings.Join(calls, "\n  "))
	}
	if s.restarted == nil {
		s.restarted = map[string]bool{}
	}
	s.restarted[p.Name] = true
	if err := p.Start(); err != nil {
		s.t.Fatalf("restart %s: %v", p.Name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := system.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		ok, _ := p.Ready(wctx)
		return ok, nil
	}); err != nil {
		s.t.Fatalf("%s not ready after its restart: %v", p.Name, err)
	}
}

// stuckCalls summarises a Go goroutine dump: one line per goroutine that
// waits inside pgx (a database call), naming the outermost pgx call and
// the first idemd frame that made it (or, for a goroutine pgx started
// itself, what started it). The pool's own upkeep is left out.
func stuckCalls(dump string) []string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		if !strings.HasPrefix(g, "goroutine ") || !strings.Contains(g, "github.com/jackc/pgx") {
			continue
		}
		lines := strings.Split(g, "\n")
		var pgxFrame, ownFrame, createdBy string
		for i := 1; i+1 < len(lines); i += 2 {
			fn := lines[i]
			if c, ok := strings.CutPrefix(fn, "created by "); ok {
				createdBy = shortFunc(c)
				break
			}
			at := strings.TrimSpace(lines[i+1])
			if j := strings.LastIndex(at, " +0x"); j > 0 {
				at = at[:j]
			}
			if j := strings.LastIndex(at, "/"); j > 0 {
				at = at[j+1:]
			}
			switch {
			case ownFrame != "":
			case strings.Contains(fn, "github.com/jackc/pgx"):
				pgxFrame = shortFunc(fn) // the outermost so far: the call made
			case strings.Contains(fn, "github.com/idemd/idemd/"):
				ownFrame = shortFunc(fn) + " (" + at + ")"
			}
		}
		if pgxFrame == "" || strings.Contains(pgxFrame, "backgroundHealthCheck") || strings.HasPrefix(createdBy, "pgxpool.NewWithConfig") {
			continue // the pool's own upkeep, not a call
		}
		if ownFrame == "" {
			ownFrame = "started by " + createdBy
		}
		head := lines[0]
		if i := strings.Index(head, " gp="); i > 0 {
			if j := strings.Index(head, " ["); j > i {
				head = head[:i] + head[j:]
			}
		}
		out = append(out, fmt.Sprintf("%s %s <- %s", strings.TrimSuffix(head, ":"), pgxFrame, ownFrame))
	}
	return out
}

// shortFunc strips a frame's package path and arguments.
func shortFunc(frame string) string {
	if i := strings.LastIndex(frame, "/"); i >= 0 {
		frame = frame[i+1:]
	}
	if i := strings.LastIndex(frame, "("); i > 0 && strings.HasSuffix(frame, ")") {
		frame = frame[:i]
	}
	return frame
}

// level is what the daemons hold: each process's goroutines
// (go_goroutines) and each application_name's sessions in
// pg_stat_activity.
type level struct {
	goroutines map[string]float64
	sessions   map[string]int
	// orphans are sessions of the daemons' applications whose client port
	// no forwarding connection of the proxy has.
	orphans []string
}

func (l level) String() string {
	var parts []string
	for _, k := range sortedKeys(l.goroutines) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, l.goroutines[k]))
	}
	var ss []string
	for _, k := range sortedKeys(l.sessions) {
		ss = append(ss, fmt.Sprintf("%s %d", k, l.sessions[k]))
	}
	out := "goroutines: " + strings.Join(parts, ", ") + "; sessions: " + strings.Join(ss, ", ")
	if len(l.orphans) > 0 {
		out += "; orphan sessions: " + strings.Join(l.orphans, ", ")
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// levelNow samples the level once.
func (s *silentRun) levelNow(ctx context.Context) level {
	l := level{goroutines: map[string]float64{}, sessions: map[string]int{}}
	for _, p := range s.daemons.All() {
		l.goroutines[p.Name] = s.gauge(ctx, p, "go_goroutines")
	}
	live := map[int]bool{}
	for _, c := range s.proxy.Conns() {
		live[c.Server.(*net.TCPAddr).Port] = true
	}
	rows, err := s.pool.Query(ctx, `SELECT application_name, coalesce(client_port, -1), pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = ANY($1)`, s.daemonApps())
	if err != nil {
		s.logf("sessions: %v", err)
		l.sessions["(unreadable)"] = -1
		return l
	}
	for rows.Next() {
		var app string
		var port, pid int
		if err := rows.Scan(&app, &port, &pid); err != nil {
			continue
		}
		l.sessions[app]++
		if !live[port] {
			l.orphans = append(l.orphans, fmt.Sprintf("%s (pid %d, port %d)", app, pid, port))
		}
	}
	if err := rows.Err(); err != nil {
		s.logf("sessions: %v", err)
		l.sessions["(unreadable)"] = -1
	}
	return l
}

// daemonApps are the application_names of the daemons' sessions
// (internal/daemon names every pool "idemd-<command>"; the enqueuer's own
// connections copy its pool's).
func (s *silentRun) daemonApps() []string {
	return []string{"idemd-enqueuer", "idemd-completer", "idemd-reaper"}
}

// warmUp abandons a burst of keys and waits until they are finished, so
// the completer holds the keep-alive connections of a full set of replays
// in flight (--concurrency; its HTTP client keeps as many idle) before the
// baseline: a burst after a fault, when the keys abandoned meanwhile are
// due at once, must not pass for a leak.
func (s *silentRun) warmUp(ctx context.Context) {
	burst := 2 * completer.DefaultSettings().Concurrency
	var ids []int64
	for range burst {
		id, err := s.abandon(ctx)
		if err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	wctx, cancel := context.WithTimeout(ctx, recoverWithin)
	defer cancel()
	if err := system.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		var open int
		err := s.pool.QueryRow(wctx, `SELECT count(*) FROM idempotency_keys WHERE id = ANY($1) AND recovery_point <> 'finished'`, ids).Scan(&open)
		return open == 0, err
	}); err != nil {
		s.t.Fatalf("the warm-up's %d keys were not finished: %v", burst, err)
	}
}

// baseline is the highest of ten samples a second apart of the steady
// state, before any fault.
func (s *silentRun) baseline(ctx context.Context) level {
	base := level{goroutines: map[string]float64{}, sessions: map[string]int{}}
	low := level{goroutines: map[string]float64{}, sessions: map[string]int{}}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := range 10 {
		l := s.levelNow(ctx)
		for k, v := range l.goroutines {
			if i == 0 || v < low.goroutines[k] {
				low.goroutines[k] = v
			}
			base.goroutines[k] = max(base.goroutines[k], v)
		}
		for k, v := range l.sessions {
			if i == 0 || v < low.sessions[k] {
				low.sessions[k] = v
			}
			base.sessions[k] = max(base.sessions[k], v)
		}
		<-tick.C
	}
	s.logf("steady state, lowest of 10 samples: %s", low)
	s.logf("steady state, highest of 10 samples: %s", base)
	return base
}

// backToLevel waits until every process's goroutines are back within the
// slack of the baseline (processes restarted by a failed recovery start
// afresh and are left out) and the daemons' sessions within their bound,
// none of them an orphan, and records the level reached.
func (s *silentRun) backToLevel(ctx context.Context, r *faultReport) {
	wctx, cancel := context.WithTimeout(ctx, levelWithin)
	defer cancel()
	var last level
	var over []string
	err := system.Poll(wctx, 500*time.Millisecond, func() (bool, error) {
		l := s.levelNow(wctx)
		if wctx.Err() != nil {
			return false, nil // a sample cut short says nothing; keep the last one
		}
		last, over = l, nil
		for p, n := range last.goroutines {
			if n < 0 {
				over = append(over, p+": /metrics unreadable")
			} else if !s.restarted[p] && n > s.base.goroutines[p]+goroutineSlack {
				over = append(over, fmt.Sprintf("%s: %.0f goroutines (steady state %.0f)", p, n, s.base.goroutines[p]))
			}
		}
		replicas := map[string]int{}
		for _, p := range s.daemons.All() {
			replicas["idemd-"+container(p)]++
		}
		for app, n := range last.sessions {
			if n < 0 {
				over = append(over, "pg_stat_activity unreadable")
			} else if bound := sessionBound(strings.TrimPrefix(app, "idemd-"), replicas[app]); n > bound {
				over = append(over, fmt.Sprintf("%s: %d sessions, more than its pools and connections hold (%d)", app, n, bound))
			}
		}
		if len(last.orphans) > 0 {
			over = append(over, "orphan sessions: "+strings.Join(last.orphans, ", "))
		}
		return len(over) == 0, nil
	})
	r.after = last
	if err != nil {
		s.t.Errorf("%s: not back to the steady state's level within %s: %s", r.name, levelWithin, strings.Join(over, "; "))
	}
	s.logf("%s: after: %s", r.name, last)
}

// logMarks are the daemons' log sizes now.
func (s *silentRun) logMarks() map[string]int64 {
	m := map[string]int64{}
	for _, p := range s.daemons.All() {
		if st, err := os.Stat(p.LogPath); err == nil {
			m[p.Name] = st.Size()
		}
	}
	return m
}

// countWarnings counts the WARN and ERROR lines each daemon logged since
// mark (the fault's start), and their distinct messages.
func (s *silentRun) countWarnings(r *faultReport, mark map[string]int64) {
	for _, p := range s.daemons.All() {
		b, err := os.ReadFile(p.LogPath)
		if err != nil || int64(len(b)) < mark[p.Name] {
			continue
		}
		msgs := map[string]int{}
		n := 0
		for _, line := range strings.Split(string(b[mark[p.Name]:]), "\n") {
			f := strings.Split(line, "\t")
			if len(f) < 4 || (f[1] != "WARN" && f[1] != "ERROR") {
				continue
			}
			n++
			msgs[f[1]+" "+f[3]]++
		}
		r.warnings[p.Name] = n
		r.messages[p.Name] = msgs
	}
}

// drainerAndStandby returns the enqueuer that is the drainer and the one
// standing by.
func (s *silentRun) drainerAndStandby(ctx context.Context) (drainer, standby *system.Proc, err error) {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = system.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		drainer, standby = nil, nil
		for _, p := range s.daemons.Enqueuers {
			switch {
			case s.gauge(wctx, p, "idemd_enqueuer_listener_up") == 1:
				drainer = p
			case s.gauge(wctx, p, "idemd_enqueuer_standby") == 1:
				standby = p
			}
		}
		return drainer != nil && standby != nil, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("no drainer and standby among the enqueuers: %w", err)
	}
	return drainer, standby, nil
}

// drainerLockSQL lists the sessions that hold (granted) or wait for the
// enqueuers' drainer lock (internal/enqueuer's key, a bigint advisory
// lock: its high and low halves are pg_locks' classid and objid), with
// their client port, the proxy's end of their connection.
const drainerLockSQL = `
WITH k AS (SELECT hashtextextended('idemd enqueuer drainer ' || current_schema(), 0) AS key)
SELECT l.granted, coalesce(a.client_port, -1) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid, k
WHERE l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (k.key >> 32) & 4294967295 AND l.objid::bigint = k.key & 4294967295`

// drainerClientPort is the client port (the proxy's side) of the session
// holding the drainer lock.
func (s *silentRun) drainerClientPort(ctx context.Context) (int, error) {
	var port int
	err := s.pool.QueryRow(ctx, `SELECT client_port FROM (`+drainerLockSQL+`) d (granted, client_port) WHERE granted`).Scan(&port)
	if err != nil {
		return 0, fmt.Errorf("the drainer lock's session: %w", err)
	}
	return port, nil
}

// gauge reads one series of a process's /metrics (-1 when unreadable).
func (s *silentRun) gauge(ctx context.Context, p *system.Proc, name string) float64 {
	return s.counter(ctx, p, name, nil)
}

// counter reads the series name with labels of p's /metrics (-1 when the
// page or the series cannot be read).
func (s *silentRun) counter(ctx context.Context, p *system.Proc, name string, labels map[string]string) float64 {
	samples, err := metricSamples(ctx, p)
	if err != nil {
		return -1
	}
	for _, sm := range samples {
		if sm.Name == name && labelsMatch(sm.Labels, labels) {
			return sm.Value
		}
	}
	return -1
}

// sampleBacklog samples staged_jobs' row count every second until the
// returned function is called, which returns the peak.
func (s *silentRun) sampleBacklog(ctx context.Context) func() int {
	sctx, cancel := context.WithCancel(ctx)
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			var n int64
			if err := s.pool.QueryRow(sctx, `SELECT count(*) FROM staged_jobs`).Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		cancel()
		<-done
		return int(peak.Load())
	}
}

// toRiver waits until every committed row of commits has its River job and
// returns each one's time from its commit's answer to the job's created_at
// (the enqueuer's insert), sorted.
func (s *silentRun) toRiver(ctx context.Context, commits map[int64]time.Time) ([]time.Duration, error) {
	ids := make([]int64, 0, len(commits))
	for id := range commits {
		ids = append(ids, id)
	}
	wctx, cancel := context.WithTimeout(ctx, recoverWithin)
	defer cancel()
	var in int
	if err := system.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		err := s.pool.QueryRow(wctx, `SELECT count(*) FROM river_job WHERE queue = $1 AND (metadata->>'idemd_staged_id')::bigint = ANY($2)`,
			unworkedQueue, ids).Scan(&in)
		return in == len(ids), err
	}); err != nil {
		return nil, fmt.Errorf("%d of %d rows committed on the slow link reached River within %s: %w", in, len(ids), recoverWithin, err)
	}
	rows, err := s.pool.Query(ctx, `SELECT (metadata->>'idemd_staged_id')::bigint, created_at FROM river_job
		WHERE queue = $1 AND (metadata->>'idemd_staged_id')::bigint = ANY($2)`, unworkedQueue, ids)
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	var id int64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		out = append(out, max(0, at.Sub(commits[id])))
		return nil
	}); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))].Round(time.Millisecond)
}

// checkProcesses: no daemon exited by itself.
func (s *silentRun) checkProcesses() {
	for _, p := range append(s.daemons.All(), s.rr.Proc) {
		starts, _, u := p.Counts()
		s.logf("%s: started %d times, %d exits not caused by the suite", p.Name, starts, len(u))
		if len(u) > 0 {
			s.t.Errorf("%s exited by itself %d times: %v", p.Name, len(u), u)
		}
	}
	st := s.proxy.Stats()
	s.logf("proxy: %+v", st)
	s.logf("replay front: %s", s.front.summary())
}

// report logs every fault's measurements, for docs/benchmarks/faults.md.
func (s *silentRun) report() {
	var b strings.Builder
	for _, r := range s.reports {
		fmt.Fprintf(&b, "\n== %s (%s)\n", r.name, r.end.Sub(r.start).Round(time.Second))
		for _, p := range s.daemons.All() {
			nr := "ready throughout"
			if d, ok := r.notReady[p.Name]; ok {
				nr = "not ready after " + d.Round(time.Millisecond).String()
			}
			fmt.Fprintf(&b, "  %-11s %s; %d WARN/ERROR lines during the fault\n", p.Name, nr, r.warnings[p.Name])
			for _, m := range sortedKeys(r.messages[p.Name]) {
				fmt.Fprintf(&b, "      %4d× %s\n", r.messages[p.Name][m], m)
			}
		}
		for _, what := range sortedKeys(r.moving) {
			fmt.Fprintf(&b, "  %-32s %s\n", what, r.moving[what].Round(time.Millisecond))
		}
		for _, n := range r.notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
		fmt.Fprintf(&b, "  before: %s\n  after:  %s\n", r.before, r.after)
	}
	s.t.Logf("silent faults report:%s", b.String())
}

// readyWatch asks every daemon's /readyz four times a second and records,
// while a fault's window is open, when each daemon's first answer other
// than 200 arrived.
type readyWatch struct {
	procs  []*system.Proc
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu     sync.Mutex
	report *faultReport // the open window's, nil when none is open
}

func newReadyWatch(procs []*system.Proc) *readyWatch { return &readyWatch{procs: procs} }

func (w *readyWatch) start(ctx context.Context) {
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	for _, p := range w.procs {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for {
				// A daemon says it is not ready when its answer arrives
				// (a readiness check may wait for its own timeouts).
				if ok, _ := p.Ready(wctx); !ok && wctx.Err() == nil {
					w.notReady(p.Name, time.Now())
				}
				select {
				case <-wctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
}

// open starts r's window: answers asked from r.start on are r's.
func (w *readyWatch) open(r *faultReport) {
	w.mu.Lock()
	w.report = r
	w.mu.Unlock()
}

// close ends the open window and returns when.
func (w *readyWatch) close() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.report = nil
	return time.Now()
}

func (w *readyWatch) notReady(name string, answered time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.report
	if r == nil || answered.Before(r.start) {
		return
	}
	if _, seen := r.notReady[name]; !seen {
		r.notReady[name] = answered.Sub(r.start)
	}
}

func (w *readyWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		w.done.Wait()
		w.cancel = nil
	}
}

// silentLoad stages rows into unworkedQueue directly (not through the proxy) at
// a set rate, one transaction every 10 ms with as many rows as the rate
// calls for, every tenth rolled back; and abandons a key every keyEvery.
type silentLoad struct {
	pool    *pgxpool.Pool
	rate    atomic.Int64
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stopped *loadStats

	mu        sync.Mutex
	recording bool
	commits   map[int64]time.Time

	committed, rolledBack, failed, keys, keyErrors atomic.Int64
}

type loadStats struct {
	committed, rolledBack, failed, keys, keyErrors int64
}

func (st loadStats) String() string {
	return fmt.Sprintf("%d rows committed, %d rolled back, %d transactions failed (the faults); %d keys abandoned, %d inserts failed",
		st.committed, st.rolledBack, st.failed, st.keys, st.keyErrors)
}

func startLoad(ctx context.Context, pool *pgxpool.Pool, abandon func(context.Context) (int64, error)) *silentLoad {
	lctx, cancel := context.WithCancel(ctx)
	l := &silentLoad{pool: pool, cancel: cancel}
	l.rate.Store(baseRate)
	l.done.Add(2)
	go func() { defer l.done.Done(); l.stage(lctx) }()
	go func() {
		defer l.done.Done()
		tick := time.NewTicker(keyEvery)
		defer tick.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-tick.C:
			}
			qctx, cancel := context.WithTimeout(lctx, 5*time.Second)
			if _, err := abandon(qctx); err != nil {
				l.keyErrors.Add(1)
			} else {
				l.keys.Add(1)
			}
			cancel()
		}
	}()
	return l
}

func (l *silentLoad) setRate(perSecond int64) { l.rate.Store(perSecond) }

// record starts (true) or stops (false) recording each committed row's
// commit time; stopping returns what was recorded.
func (l *silentLoad) record(on bool) map[int64]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.commits
	l.recording, l.commits = on, nil
	if on {
		l.commits = map[int64]time.Time{}
	}
	return out
}

func (l *silentLoad) stage(ctx context.Context) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	rate, start, sent, txs := l.rate.Load(), time.Now(), int64(0), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if r := l.rate.Load(); r != rate {
			rate, start, sent = r, time.Now(), 0
		}
		due := int64(float64(rate)*time.Since(start).Seconds()) - sent
		if due <= 0 {
			continue
		}
		n := min(due, 2000)
		txs++
		rollback := txs%10 == 0
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ids, err := stageRows(qctx, l.pool, int(n), rollback)
		answered := time.Now()
		cancel()
		switch {
		case err != nil:
			l.failed.Add(1)
			// No catching up after a fault: the rate resumes from now.
			start, sent = time.Now(), 0
			continue
		case rollback:
			l.rolledBack.Add(n)
		default:
			l.committed.Add(n)
			l.mu.Lock()
			if l.recording {
				for _, id := range ids {
					l.commits[id] = answered
				}
			}
			l.mu.Unlock()
		}
		sent += n
	}
}

// stop ends the load (once) and returns its counts.
func (l *silentLoad) stop() loadStats {
	if l.stopped == nil {
		l.cancel()
		l.done.Wait()
		l.stopped = &loadStats{l.committed.Load(), l.rolledBack.Load(), l.failed.Load(), l.keys.Load(), l.keyErrors.Load()}
	}
	return *l.stopped
}

// stageRows stages n rows of unworkedQueue in one transaction, committed
// or rolled back, and returns their ids.
func stageRows(ctx context.Context, pool *pgxpool.Pool, n int, rollback bool) ([]int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("stage: begin: %w", err)
	}
	defer func() {
		// After a commit, a no-op; after a timeout, on a closed connection.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		tx.Rollback(rctx) //nolint:errcheck
	}()
	rows, err := tx.Query(ctx, `INSERT INTO staged_jobs (job_name, job_args, queue)
		SELECT 'e2e_silent_load', '{}'::jsonb, $1 FROM generate_series(1, $2) RETURNING id`, unworkedQueue, n)
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	if rollback {
		return ids, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("stage: commit: %w", err)
	}
	return ids, nil
}

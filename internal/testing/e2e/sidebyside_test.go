//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/alertcheck"
	"github.com/idemd/idemd/internal/testing/e2e/overlap"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/horizon"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// The reapers of the side-by-side run: small batches with a pause between
// them, so that a run over a pile of old keys lasts seconds and two runs
// that were not fenced would delete at the same time.
const (
	pileKeys        = 2000
	reaperBatchSize = "20"
	reaperPause     = "25ms"
	reaperLeaseTTL  = 6 * time.Second
)

// sideBySide is the state of TestSideBySideUpgradeAndRollback beyond env:
// the two releases' binaries and the processes outside the daemon set.
// curApplicationPrefix names the current release's enqueuer and completer
// sessions (application_name), apart from the previous release's.
const curApplicationPrefix = "idemd-cur-"

type sideBySide struct {
	*env
	old *system.Binaries
	// prevSchema is the newest migration the previous release ships.
	prevSchema int64
	daemonURL  string
	// cur are the current release's long-running daemons (the rolling
	// deploy's new replicas).
	cur *system.DaemonSet
	// once are the one-shot reaper runs (a CronJob's, or an operator's).
	once []*system.Proc
	// rounds counts the piles seeded; deleters names, per release, the
	// reaper processes that were first to delete a pile.
	rounds   int
	deleters map[string][]string
}

// TestSideBySideUpgradeAndRollback is CHANGELOG.md's upgrade from the
// previous release and its rollback, with both releases running at once
// under Rocket Rides traffic and faults:
//
//  1. The previous release alone: its roles.sql and idemctl migrate, its
//     enqueuers, completers and scheduled reaper; SIGKILLs of an enqueuer
//     and a completer, connections cut.
//  2. The upgrade: a current enqueuer starts before the migration (not
//     ready below its floor, 00021, and naming `idemctl migrate`, while the
//     previous enqueuers move every job), the current idemctl migrate runs
//     under traffic and it becomes ready,
//     then a current completer and scheduled reaper start beside the
//     previous replicas. Rounds of a pile of old keys, each met by reaper
//     runs of both releases at once; SIGKILLs of the current enqueuer and
//     completer, connections cut mid-round, a held snapshot.
//  3. The rollback: the current daemons stop, the previous idemctl migrate
//     runs and must change nothing, the previous daemons go on; a reaper
//     run SIGKILLed mid-pile is taken over.
//
// The oracles (SQL and the fake Stripe): every committed staged job in
// River exactly once, at most one charge per ride and per Stripe key, every
// abandoned key finished or flagged, no two replays of a key at once, and,
// from a trigger on idempotency_keys, no two reaper processes ever
// deleting at the same time, whatever their releases.
func TestSideBySideUpgradeAndRollback(t *testing.T) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := setUpSideBySide(ctx, t)
	defer system.CloseIdleConnections()
	// This release's sessions hold no snapshot longer than the bound
	// (docs/design.md, invariant 7); the previous release's standby
	// enqueuer waited in pg_advisory_lock and did, so its sessions are not
	// held to it.
	hz := horizon.Start(ctx, s.pool, horizon.Options{Logf: s.logf, Ours: func(app, _ string) bool {
		return strings.HasPrefix(app, curApplicationPrefix) || strings.HasPrefix(app, "reaper-cur-")
	}})
	defer func() {
		if t.Failed() {
			for _, p := range append(append(append(s.daemons.All(), s.cur.All()...), s.once...), s.rr.Proc) {
				t.Logf("---- tail of %s\n%s", p.Name, p.LogTail(3000))
			}
			t.Logf("---- PostgreSQL log tail\n%s", tail(s.cluster.LogPath(), 3000))
		}
	}()

	// Traffic for as long as the script runs, in short runs of the
	// simulator so that it stops when the script ends, not mid-ride.
	riders, err := system.Riders(ctx, s.pool, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	simClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer simClient.CloseIdleConnections()
	stopTraffic := make(chan struct{})
	trafficDone := make(chan simulator.Stats, 1)
	// endTraffic stops the traffic and returns its counts; deferred too, so
	// that a test that fails midway leaves no simulator running.
	endTraffic := sync.OnceValue(func() simulator.Stats { close(stopTraffic); return <-trafficDone })
	defer endTraffic()
	go func() {
		var total simulator.Stats
		defer func() { trafficDone <- total }()
		for {
			select {
			case <-stopTraffic:
				return
			default:
			}
			st, err := simulator.Run(ctx, simulator.Config{
				BaseURL: s.rr.APIURL, APIKeys: riders, Concurrency: 4, Duration: 3 * time.Second,
				GiveUpRate: 0.2, GiveUpAfter: 60 * time.Millisecond, MaxRetries: 2, HTTPClient: simClient,
			})
			total = addStats(total, st)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("simulator: %v", err)
				}
				return
			}
		}
	}()

	s.previousAlone(ctx)
	s.upgrade(ctx)
	s.rollback(ctx)

	stats := endTraffic()
	s.logf("traffic done: %s", stats)
	if stats.Created == 0 || stats.GaveUp == 0 {
		t.Errorf("traffic did not exercise the system: %s", stats)
	}
	if stats.Rejected > 0 {
		t.Errorf("%d requests rejected with a 4xx other than 402/409", stats.Rejected)
	}

	s.settle(ctx)
	s.checkProcesses(s.cur.All()...)
	stopDaemons(t, s.daemons, "previous release's")
	s.oracle(ctx, stats)
	s.checkHorizon(hz.Stop())
	expectNoRows(ctx, t, s.pool, "pile keys left behind", `SELECT idempotency_key FROM idempotency_keys WHERE idempotency_key LIKE 'e2e-pile-%'`)
	s.checkReaperFence(ctx)
	if locks, err := dbtest.AdvisoryLocks(ctx, s.pool); err != nil || locks != 0 {
		t.Errorf("advisory locks held after the run: %d (%v)", locks, err)
	}
	s.scanLogs(append(s.cur.All(), s.once...)...)
	t.Logf("side-by-side run took %s", time.Since(started).Round(time.Second))
}

// setUpSideBySide builds both releases, starts a cluster, applies the
// previous release's roles.sql and migrate as that release deployed
// (roles, migrate, roles again), and starts Rocket Rides, the replay
// front, the proxy and the previous release's daemons.
func setUpSideBySide(ctx context.Context, t *testing.T) *sideBySide {
	t.Helper()
	s := &sideBySide{env: &env{t: t, dir: t.TempDir(), poison: []int64{}}, deleters: map[string][]string{}}
	prevDir := filepath.Join(s.dir, "previous")
	prev := previousRelease(t)
	s.old = buildRelease(ctx, t, prev.Commit, prevDir)
	var err error
	if s.bins, err = system.Build(ctx, filepath.Join(s.dir, "bin")); err != nil {
		t.Fatal(err)
	}
	s.cluster = dbtest.StartCluster(t)
	if s.dbURL, _, err = scratchdb.Create(ctx, s.cluster.URL(), "idemd_sidebyside"); err != nil {
		t.Fatal(err)
	}
	if s.pool, err = pgxpool.New(ctx, s.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.pool.Close)

	// The previous release's roles.sql ran before and after each migrate.
	roles, err := os.ReadFile(filepath.Join(prevDir, "src", "deploy", "sql", "roles.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if s.prevSchema, err = newestMigration(filepath.Join(prevDir, "src", "migrations")); err != nil {
		t.Fatal(err)
	}
	if s.prevSchema >= migrate.Newest() {
		t.Fatalf("the previous release ships migration %d, the current one %d: nothing to upgrade", s.prevSchema, migrate.Newest())
	}
	if _, err := s.pool.Exec(ctx, string(roles)); err != nil {
		t.Fatalf("the previous roles.sql: %v", err)
	}
	if err := system.Migrate(ctx, s.old, dbtest.MigratorURL(s.dbURL)); err != nil {
		t.Fatalf("the previous idemctl migrate: %v", err)
	}
	if _, err := s.pool.Exec(ctx, string(roles)); err != nil {
		t.Fatalf("the previous roles.sql after its migrate: %v", err)
	}
	if v := s.schemaVersion(ctx); v != s.prevSchema {
		t.Fatalf("the previous idemctl migrate left schema %d, want %d", v, s.prevSchema)
	}

	opts := s.startSurroundings(ctx, fmt.Sprintf("127.0.0.1:%d", s.cluster.Port()))
	s.daemonURL = opts.DatabaseURL
	if err := s.installDeletionLog(ctx); err != nil {
		t.Fatal(err)
	}

	// Both releases' daemons with the suite's flags; the reapers are
	// built here, each naming its sessions (application_name) so that the
	// deletion log tells the processes apart.
	opts.Enqueuers, opts.Completers = 2, 2
	if s.daemons, err = s.daemonSet(s.old, "prev", opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.daemons.Close)
	opts.Enqueuers, opts.Completers = 1, 1
	opts.ApplicationPrefix = curApplicationPrefix
	if s.cur, err = s.daemonSet(s.bins, "cur", opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.cur.Close)
	t.Cleanup(func() {
		for _, p := range s.once {
			p.Close()
		}
	})
	if err := s.daemons.Start(); err != nil {
		t.Fatal(err)
	}
	s.waitReady(ctx, s.daemons.All()...)
	for _, p := range s.daemons.All() {
		if s.exportsBuildInfo(ctx, p) {
			t.Fatalf("%s exports idemd_build_info: not the previous release's binary", p.Name)
		}
	}
	s.logf("previous release (%s at %.7s) on schema %d: %d daemons ready", prev.Version, prev.Commit, s.prevSchema, len(s.daemons.All()))
	return s
}

// daemonSet is one release's enqueuers and completers (system.NewDaemons)
// and its scheduled reaper, named after the release ("prev", "cur").
func (s *sideBySide) daemonSet(bins *system.Binaries, release string, o system.DaemonOptions) (*system.DaemonSet, error) {
	o.Dir = filepath.Join(s.dir, release)
	o.PreviousRelease = release == "prev"
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	d, err := system.NewDaemons(bins, o)
	if err != nil {
		return nil, err
	}
	for _, p := range d.All() {
		p.Name = release + "-" + p.Name
	}
	addr, err := system.FreeAddr()
	if err != nil {
		return nil, err
	}
	d.Reaper = s.reaperProc(bins, "reaper-"+release+"-scheduled",
		"--schedule", "@every 2s", "--http-addr", addr, "--shutdown-timeout", "10s")
	d.Reaper.OpsAddr = addr
	return d, nil
}

// reaperProc is a reaper process whose sessions carry its name as
// application_name (the URL's setting wins over the reaper's own).
func (s *sideBySide) reaperProc(bins *system.Binaries, name string, extra ...string) *system.Proc {
	u, err := url.Parse(s.daemonURL)
	if err != nil {
		s.t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	args := []string{"--database-url", u.String(), "--log-format", "console",
		"--retention", "1h", "--lock-window", "1h", "--lease-ttl", reaperLeaseTTL.String(), "--statement-timeout", "5s",
		"--batch-size", reaperBatchSize, "--batch-pause", reaperPause}
	return &system.Proc{Name: name, Bin: bins.Reaper, Args: append(args, extra...), LogPath: filepath.Join(s.dir, name+".log")}
}

// previousAlone is phase 1: the previous release alone under traffic, old
// keys for its reaper and completers, an enqueuer and a completer
// SIGKILLed, connections cut.
func (s *sideBySide) previousAlone(ctx context.Context) {
	sleep(ctx, jitter(time.Second))
	if err := s.seedOldKeys(ctx); err != nil {
		s.t.Fatal(err)
	}
	s.killAndRestart(s.daemons.Enqueuers[0])
	sleep(ctx, jitter(time.Second))
	s.killAndRestart(s.daemons.Completers[0])
	n := s.proxy.Sever()
	s.logf("proxy: severed %d sockets", n)
	// The previous reaper (or a completer giving up) clears the old keys
	// before the piles begin, so that the first reaper deletion after a
	// pile is inserted is that pile's.
	s.poll(ctx, "the previous release clears the old keys", func(ctx context.Context) (bool, error) {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'e2e-old-%'`).Scan(&n)
		return n == 0, err
	})
	s.logf("phase 1: the previous release cleared the old keys")
}

// upgrade is phase 2, CHANGELOG.md's upgrade order with a rolling deploy's
// overlap: the current enqueuer starts early (before the migration, which
// CHANGELOG.md says it waits for, not ready), then the current migrate runs under
// traffic (it applies the grants itself: roles.sql is not rerun), then
// the current completer and reaper start beside the previous replicas.
func (s *sideBySide) upgrade(ctx context.Context) {
	t := s.t
	// The current idemctl reads the previous schema (its floor is no newer),
	// so an operator can look before migrating.
	if out, err := execOut(ctx, s.bins.Idemctl, "status", "--database-url", dbtest.RuntimeURL(s.dbURL), "--log-format", "console"); err != nil {
		t.Errorf("the current idemctl status on the previous schema: %v\n%s", err, out)
	} else {
		s.logf("current idemctl status on schema %d:\n%s", s.prevSchema, out)
	}
	// The current enqueuer needs migration 00021 (River's unique columns
	// and the move's own check; CHANGELOG.md): started before the
	// migration, it is not ready, names `idemctl migrate` and moves
	// nothing, while the previous replicas go on moving every job; it
	// becomes ready once the migration has run, without a restart.
	enq := s.cur.Enqueuers[0]
	if err := enq.Start(); err != nil {
		t.Fatal(err)
	}
	var notReady string
	s.poll(ctx, enq.Name+" not ready on the previous schema", func(ctx context.Context) (bool, error) {
		if !enq.Running() {
			return false, fmt.Errorf("%s exited", enq.Name)
		}
		ok, why := enq.Ready(ctx)
		if ok {
			return false, fmt.Errorf("%s ready on schema %d, below its floor %d", enq.Name, s.prevSchema, enqueuer.OldestSchema)
		}
		notReady = why
		return strings.Contains(why, "idemctl migrate"), nil
	})
	if !s.exportsBuildInfo(ctx, enq) {
		t.Fatalf("%s does not export idemd_build_info: not the current binary", enq.Name)
	}
	s.logf("%s not ready on schema %d, before the migration: %s", enq.Name, s.prevSchema, notReady)

	if err := system.Migrate(ctx, s.bins, dbtest.MigratorURL(s.dbURL)); err != nil {
		t.Fatalf("the current idemctl migrate under traffic: %v", err)
	}
	if v := s.schemaVersion(ctx); v != migrate.Newest() {
		t.Fatalf("the current idemctl migrate left schema %d, want %d", v, migrate.Newest())
	}
	s.logf("current idemctl migrate: schema %d", migrate.Newest())
	s.waitReady(ctx, enq)
	s.waitSchemaSeen(ctx, enq, migrate.Newest())
	s.waitReady(ctx, s.daemons.All()...) // the previous replicas on the newer schema

	for _, p := range append(s.cur.Completers, s.cur.Reaper) {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	s.waitReady(ctx, s.cur.All()...)
	// Each current daemon's floor is the previous release's newest
	// migration or older, but for those the CHANGELOG names: the
	// completer needs 00019, the enqueuer 00021 and the reaper 00030, and
	// each is not ready until migrate has run (the completer and the
	// reaper start after it here; the enqueuer above showed it).
	for _, p := range s.cur.All() {
		floor := s.gauge(ctx, p, "idemd_schema_version", "binary_oldest")
		want := floor >= 1 && floor <= float64(s.prevSchema)
		switch {
		case slices.Contains(s.cur.Completers, p):
			want = floor == completer.OldestSchema
		case slices.Contains(s.cur.Enqueuers, p):
			want = floor == enqueuer.OldestSchema
		case p == s.cur.Reaper:
			want = floor == reaper.OldestSchema
		}
		if !want {
			t.Errorf("%s: schema floor %v, want 1..%d (the completer: %d, the enqueuer: %d, the reaper: %d, as the CHANGELOG says)",
				p.Name, floor, s.prevSchema, completer.OldestSchema, enqueuer.OldestSchema, reaper.OldestSchema)
		}
	}
	s.logf("current enqueuer, completer and reaper beside the previous ones")
	// API faults while both releases run: 500s anywhere and serialization
	// failures mid-ride, for clients and both releases' replays alike.
	if err := s.rr.SetFaults(ctx,
		api.FaultRule{At: "", Rate: 0.1, Kind: api.FaultInternal},
		api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 0.2, Kind: api.FaultSerialization},
	); err != nil {
		t.Fatal(err)
	}
	s.logf("API faults on")
	defer func() {
		if err := s.rr.SetFaults(ctx); err != nil {
			t.Error(err)
		}
		s.logf("API faults off")
	}()

	// Piles of old keys, each met by reaper runs of both releases at once,
	// the releases taking turns to start first: at least four rounds, and
	// until each release's reaper has been the one deleting a pile.
	for round := 0; round < 4 || len(s.deleters["prev"]) == 0 || len(s.deleters["cur"]) == 0; round++ {
		if round == 8 {
			t.Errorf("after %d rounds, piles were first deleted by the previous release's reapers %v and by the current one's %v: both should have",
				round, s.deleters["prev"], s.deleters["cur"])
			break
		}
		var during, after func()
		cut := false
		switch round {
		case 1:
			s.killAndRestart(s.cur.Enqueuers[0])
		case 2:
			s.killAndRestart(s.cur.Completers[0])
			// Every daemon connection cut while a reaper is mid-pile.
			during = func() { s.logf("proxy: severed %d sockets mid-pile", s.proxy.Sever()) }
			cut = true
		case 3:
			// A snapshot held across the whole round.
			after = s.holdSnapshot(ctx)
		}
		s.pileRound(ctx, round%2 == 1, round, during, cut)
		if after != nil {
			after()
		}
	}
}

// rollback is phase 3: the current daemons stop, the previous release's
// migrate Job runs (nothing to do: the schema must not change), and the
// previous daemons go on alone; a pile whose deleting reaper is SIGKILLed
// mid-run.
func (s *sideBySide) rollback(ctx context.Context) {
	t := s.t
	codes := stopDaemons(t, s.cur, "current release's")
	s.logf("rollback: current daemons stopped %v", codes)

	before := s.schemaCatalog(ctx)
	if err := system.Migrate(ctx, s.old, dbtest.MigratorURL(s.dbURL)); err != nil {
		t.Fatalf("the previous idemctl migrate on the newer schema: %v", err)
	}
	after := s.schemaCatalog(ctx)
	if gone, added := setDiff(before, after), setDiff(after, before); len(gone)+len(added) > 0 {
		t.Errorf("the previous idemctl migrate changed the schema: gone %v, added %v", gone, added)
	}
	s.logf("rollback: the previous idemctl migrate changed nothing (%d catalog entries compared)", len(before))
	s.waitReady(ctx, s.daemons.All()...)

	s.killAndRestart(s.daemons.Completers[1])
	s.killedPileRound(ctx)
}

// pileRound inserts a pile of old finished keys and starts a one-shot
// reaper run of one release; once a reaper (whichever: the one-shot run or
// a scheduled one) is deleting the pile, it starts a one-shot run of the
// other release, which must find the lease held and wait or do nothing.
// Unfenced, the two would delete side by side for seconds.
func (s *sideBySide) pileRound(ctx context.Context, prevFirst bool, round int, during func(), cut bool) {
	first, other := "prev", "cur"
	if !prevFirst {
		first, other = other, first
	}
	mark := s.seedPile(ctx)
	a := s.startOnce(first)
	deleter := s.firstDeleter(ctx, mark)
	// The other release than the deleting run's.
	if strings.HasPrefix(deleter, "reaper-"+other+"-") {
		other = first
	}
	b := s.startOnce(other)
	if during != nil {
		during()
	}
	s.waitPileGone(ctx)
	s.waitOnce(ctx, cut, a, b)
	s.logf("pile round %d: %s deleting, %s started beside it", round, deleter, b.Name)
}

// killedPileRound: the reaper deleting a pile is SIGKILLed mid-run (a
// scheduled one is restarted, as its Deployment would); a one-shot run
// started after the kill waits out the dead run's lease and finishes the
// pile.
func (s *sideBySide) killedPileRound(ctx context.Context) {
	mark := s.seedPile(ctx)
	a := s.startOnce("prev")
	deleter := s.firstDeleter(ctx, mark)
	killed := a
	if deleter != a.Name {
		killed = s.daemons.Reaper
		if deleter != killed.Name {
			s.t.Fatalf("the pile was first deleted by %s, neither %s nor %s", deleter, a.Name, killed.Name)
		}
	}
	if err := killed.Kill(); err != nil {
		s.t.Fatal(err)
	}
	s.logf("SIGKILL %s mid-pile", killed.Name)
	if killed == s.daemons.Reaper {
		if err := killed.Start(); err != nil {
			s.t.Fatal(err)
		}
	}
	b := s.startOnce("prev")
	s.waitPileGone(ctx)
	others := []*system.Proc{b}
	if killed != a {
		others = append(others, a)
	}
	s.waitOnce(ctx, false, others...)
	s.logf("killed pile round: %s SIGKILLed mid-run, the pile finished by the takeover", killed.Name)
}

// holdSnapshot opens a REPEATABLE READ transaction that has read
// staged_jobs and keeps it open (its snapshot holds back the xmin horizon,
// as a long report query would) until release.
func (s *sideBySide) holdSnapshot(ctx context.Context) (release func()) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		s.t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	s.logf("snapshot held (it saw %d staged rows)", n)
	return func() {
		if err := tx.Commit(ctx); err != nil {
			s.t.Errorf("release the held snapshot: %v", err)
		}
		s.logf("snapshot released")
	}
}

// seedPile inserts pileKeys finished keys 80 hours old (a second apart, so
// the reaper's range batches apply) and returns the deletion log's highest
// id before them.
func (s *sideBySide) seedPile(ctx context.Context) int64 {
	s.rounds++
	var mark int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM e2e_key_deletions`).Scan(&mark); err != nil {
		s.t.Fatal(err)
	}
	_, err := s.pool.Exec(ctx, `
WITH u AS (
    INSERT INTO users (email, stripe_customer_id, api_key_sha256)
    VALUES ('e2e-pile-' || $1 || '@example.com', 'cus_e2e_pile_' || $1, 'e2e-pile-key-' || $1) RETURNING id)
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method, request_params,
    request_path, response_code, response_body, recovery_point, user_id, upstream_idempotency_key)
SELECT now() - interval '80 hours' - make_interval(secs => g), 'e2e-pile-' || $1 || '-' || g,
    now() - interval '80 hours', NULL, 'POST', '{}', '/rides', 201, '{}', 'finished', u.id, gen_random_uuid()
FROM u, generate_series(1, $2::int) g`, fmt.Sprint(s.rounds), pileKeys)
	if err != nil {
		s.t.Fatalf("seed pile: %v", err)
	}
	return mark
}

// startOnce starts a one-shot reaper run of release ("prev" or "cur").
func (s *sideBySide) startOnce(release string) *system.Proc {
	bins := s.old
	if release == "cur" {
		bins = s.bins
	}
	p := s.reaperProc(bins, fmt.Sprintf("reaper-%s-once-%d", release, len(s.once)+1), "--once")
	s.once = append(s.once, p)
	if err := p.Start(); err != nil {
		s.t.Fatal(err)
	}
	return p
}

// firstDeleter waits for the first reaper deletion logged after mark and
// returns the deleting process's name.
func (s *sideBySide) firstDeleter(ctx context.Context, mark int64) string {
	var name string
	s.poll(ctx, "a reaper deletes the pile", func(ctx context.Context) (bool, error) {
		err := s.pool.QueryRow(ctx, `SELECT application_name FROM e2e_key_deletions
			WHERE id > $1 AND application_name LIKE 'reaper-%' ORDER BY id LIMIT 1`, mark).Scan(&name)
		if err == pgx.ErrNoRows {
			return false, nil
		}
		return err == nil, err
	})
	release := strings.Split(name, "-")[1]
	s.deleters[release] = append(s.deleters[release], name)
	return name
}

func (s *sideBySide) waitPileGone(ctx context.Context) {
	s.poll(ctx, "the pile is deleted", func(ctx context.Context) (bool, error) {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'e2e-pile-%'`).Scan(&n)
		return n == 0, err
	})
}

// waitOnce waits for one-shot runs to end; each must exit 0 (a run that
// found the lease held did nothing, which is a success). With cut, the
// daemons' connections were severed during the runs: a run whose batch
// lost its connection ends with an error (exit 1, its summary's result
// "error") and leaves the rest to the next run, which is allowed.
func (s *sideBySide) waitOnce(ctx context.Context, cut bool, procs ...*system.Proc) {
	for _, p := range procs {
		wctx, cancel := context.WithTimeout(ctx, 2*reaperLeaseTTL+30*time.Second)
		code, err := p.Wait(wctx)
		cancel()
		if err == nil && code == 1 && cut && strings.Contains(p.LogTail(4000), `"result": "error"`) {
			s.logf("%s ended with an error after the cut (exit 1)", p.Name)
			continue
		}
		if err != nil || code != 0 {
			s.t.Errorf("%s: exit %d, %v\n%s", p.Name, code, err, p.LogTail(2000))
		}
	}
}

// killAndRestart SIGKILLs p and starts it again after a random pause, as a
// crash and the Deployment's restart would.
func (s *sideBySide) killAndRestart(p *system.Proc) {
	if err := p.Kill(); err != nil {
		s.t.Fatal(err)
	}
	pause := time.Duration(rand.IntN(600)) * time.Millisecond
	time.Sleep(pause) // the process stays dead a random while, as after a real crash
	if err := p.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.logf("SIGKILL %s, restarted after %s", p.Name, pause)
}

// waitReady polls /readyz of procs until each answers 200; a process that
// exits meanwhile fails the test.
func (s *sideBySide) waitReady(ctx context.Context, procs ...*system.Proc) {
	for _, p := range procs {
		var why string
		s.poll(ctx, p.Name+" ready", func(ctx context.Context) (bool, error) {
			if !p.Running() {
				return false, fmt.Errorf("%s exited", p.Name)
			}
			ok, w := p.Ready(ctx)
			why = w
			return ok, nil
		})
		if why != "" {
			s.logf("%s /readyz: %s", p.Name, why)
		}
	}
}

// waitSchemaSeen polls until p's idemd_schema_version{of="database"} is
// version (read with /readyz, which the poll asks for).
func (s *sideBySide) waitSchemaSeen(ctx context.Context, p *system.Proc, version int64) {
	s.poll(ctx, fmt.Sprintf("%s sees schema %d", p.Name, version), func(ctx context.Context) (bool, error) {
		if ok, why := p.Ready(ctx); !ok {
			return false, fmt.Errorf("not ready: %s", why)
		}
		samples, err := metricSamples(ctx, p)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(samples, func(m alertcheck.Sample) bool {
			return m.Name == "idemd_schema_version" && m.Labels["of"] == "database" && m.Value == float64(version)
		}), nil
	})
}

// gauge reads one sample of p's /metrics, the one whose "of" label is of.
func (s *sideBySide) gauge(ctx context.Context, p *system.Proc, name, of string) float64 {
	samples, err := metricSamples(ctx, p)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range samples {
		if m.Name == name && m.Labels["of"] == of {
			return m.Value
		}
	}
	s.t.Fatalf("%s exports no %s{of=%q}", p.Name, name, of)
	return 0
}

func (s *sideBySide) exportsBuildInfo(ctx context.Context, p *system.Proc) bool {
	page, err := p.Metrics(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.Contains(string(page), "idemd_build_info")
}

// poll waits for cond with the suite's deadline for a step.
func (s *sideBySide) poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) {
	s.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) { return cond(wctx) }); err != nil {
		s.t.Fatalf("%s: %v", what, err)
	}
}

// schemaVersion is the highest idemd migration applied.
func (s *sideBySide) schemaVersion(ctx context.Context) int64 {
	var v int64
	if err := s.pool.QueryRow(ctx, `SELECT max(version_id) FROM idemd_schema_migrations WHERE is_applied`).Scan(&v); err != nil {
		s.t.Fatal(err)
	}
	return v
}

// schemaCatalog lists what a migration could change in the database: the
// relations with their privileges and options, columns, constraints,
// indexes, triggers, functions and both migration tables' rows.
func (s *sideBySide) schemaCatalog(ctx context.Context) []string {
	rows, err := s.pool.Query(ctx, `
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, '') || ' options=' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
    || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' acl=' || coalesce(a.attacl::text, '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(oid) || ' enabled=' || tgenabled::text FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'function ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid)) || ' acl=' || coalesce(p.proacl::text, '')
FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prokind IN ('f', 'p')
UNION ALL
SELECT 'idemd migration ' || (to_jsonb(m) - 'tstamp')::text FROM idemd_schema_migrations m
UNION ALL
SELECT 'river migration ' || (to_jsonb(r) - 'created_at')::text FROM river_migration r`)
	if err != nil {
		s.t.Fatalf("schema catalog: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		s.t.Fatalf("schema catalog: %v", err)
	}
	return out
}

// installDeletionLog records every DELETE statement on idempotency_keys
// that deleted rows and committed: the session's application_name and
// backend pid, its transaction, the transaction's start and the moment the
// statement had deleted. A statement-level trigger with a transition
// table, SECURITY DEFINER so that the daemons' role needs no grant on the
// log; it sees every deleter, whatever release or code path.
func (e *env) installDeletionLog(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, `
CREATE TABLE e2e_key_deletions (
    id               BIGSERIAL PRIMARY KEY,
    application_name TEXT        NOT NULL,
    backend_pid      INT         NOT NULL,
    txid             BIGINT      NOT NULL,
    xact_start       TIMESTAMPTZ NOT NULL,
    deleted_at       TIMESTAMPTZ NOT NULL,
    deleted          BIGINT      NOT NULL
);
CREATE FUNCTION e2e_key_deletions() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM gone;
    IF n > 0 THEN
        INSERT INTO e2e_key_deletions (application_name, backend_pid, txid, xact_start, deleted_at, deleted)
        VALUES (current_setting('application_name'), pg_backend_pid(), txid_current(), now(), clock_timestamp(), n);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER e2e_key_deletions AFTER DELETE ON idempotency_keys
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION e2e_key_deletions();`)
	if err != nil {
		return fmt.Errorf("deletion log: %w", err)
	}
	return nil
}

// checkReaperFence is the reaper oracle over the deletion log: no two
// reaper processes deleted at the same time. A one-shot run is one span
// from its first transaction's start to its last deletion; a scheduled
// reaper's runs are not told apart in the log, so each of its transactions
// is a span. Every reaper deletion must come from a named process (the
// default application_name would mean the log cannot tell them apart).
func (s *sideBySide) checkReaperFence(ctx context.Context) {
	t := s.t
	rows, err := s.pool.Query(ctx, `SELECT application_name, txid, xact_start, deleted_at, deleted
		FROM e2e_key_deletions WHERE application_name LIKE 'reaper-%' OR application_name LIKE 'idemd-reaper%' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (overlap.Deletion, error) {
		var d overlap.Deletion
		err := r.Scan(&d.Process, &d.Txid, &d.XactStart, &d.At, &d.Rows)
		return d, err
	})
	if err != nil {
		t.Fatal(err)
	}
	perProcess := map[string]int64{}
	for _, d := range ds {
		perProcess[d.Process] += d.Rows
		if strings.HasPrefix(d.Process, "idemd-reaper") {
			t.Errorf("a reaper deleted as %q: its process cannot be told apart", d.Process)
		}
	}
	spans := overlap.Spans(ds, func(p string) bool { return strings.Contains(p, "-once-") })
	pairs := overlap.Find(spans)
	for i, p := range pairs {
		if i == 10 {
			t.Errorf("... %d overlapping pairs in all", len(pairs))
			break
		}
		t.Errorf("two reaper processes deleted at the same time: %s", p)
	}
	s.logf("reaper fence: %d deletions in %d spans by %d processes, %d overlapping pairs; rows by process %v",
		len(ds), len(spans), len(perProcess), len(pairs), perProcess)
	s.logf("reaper fence: piles first deleted by the previous release's %v, by the current release's %v",
		s.deleters["prev"], s.deleters["cur"])
	// What the reapers say about it (their own account, for the log only).
	held := map[string]int{}
	for _, p := range append(append(s.once, s.daemons.Reaper), s.cur.Reaper) {
		if n := strings.Count(p.LogTail(1<<20), "another reaper run holds the lease"); n > 0 {
			held[p.Name] = n
		}
	}
	s.logf("reaper fence: runs that found the lease held, by their logs: %v", held)
	var total int64
	for _, n := range perProcess {
		total += n
	}
	if want := int64(s.rounds * pileKeys); total < want {
		t.Errorf("reapers deleted %d keys, fewer than the %d of the piles", total, want)
	}
}

func expectNoRows(ctx context.Context, t *testing.T, pool *pgxpool.Pool, what, sql string) {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+sql+`) x`).Scan(&n); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if n > 0 {
		t.Errorf("%s: %d", what, n)
	}
}

// newestMigration is the highest migration number among dir's files
// (00017_name.sql is 17).
func newestMigration(dir string) (int64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return 0, err
	}
	var newest int64
	for _, f := range files {
		var n int64
		if _, err := fmt.Sscanf(filepath.Base(f), "%05d_", &n); err == nil && n > newest {
			newest = n
		}
	}
	if newest == 0 {
		return 0, fmt.Errorf("no migration in %s", dir)
	}
	return newest, nil
}

// setDiff is what a has and b lacks.
func setDiff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func addStats(a, b simulator.Stats) simulator.Stats {
	a.Rides += b.Rides
	a.Requests += b.Requests
	a.Created += b.Created
	a.Declined += b.Declined
	a.GaveUp += b.GaveUp
	a.Abandoned += b.Abandoned
	a.Rejected += b.Rejected
	a.Conflicts += b.Conflicts
	a.Errors5xx += b.Errors5xx
	return a
}

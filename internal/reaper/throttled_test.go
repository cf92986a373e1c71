package reaper

import (
	"cmp"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/reaperpause"
	"github.com/idemd/idemd/internal/runhistory"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// runAsync starts one run and returns a channel with its end.
type runEnd struct {
	res *Result
	err error
}

func runAsync(svc *Service) <-chan runEnd {
	done := make(chan runEnd, 1)
	go func() {
		res, err := svc.RunOnce(context.Background())
		done <- runEnd{res, err}
	}()
	return done
}

// waitThrottled reads the throttle's decisions until one waits for one of
// reasons, and returns it.
func waitThrottled(t *testing.T, svc *Service, reasons ...throttle.Reason) throttle.Decision {
	t.Helper()
	for {
		d := svc.signals.decided.WaitOrTimeout(t)
		if d.Stop {
			t.Fatalf("the throttle stopped the run: %+v", d)
		}
		for _, r := range reasons {
			if d.Throttled() && d.Reason == r {
				return d
			}
		}
	}
}

// holdsBatches checks that no batch runs while the run stays throttled:
// over n more throttled decisions, the keys left do not change.
func holdsBatches(t *testing.T, svc *Service, pool *pgxpool.Pool, n int, reasons ...throttle.Reason) {
	t.Helper()
	left := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys`)
	for range n {
		waitThrottled(t, svc, reasons...)
	}
	if now := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys`); now != left {
		t.Fatalf("keys went from %d to %d while the run was throttled", left, now)
	}
}

// An operator's pause holds a run before its first batch until the resume;
// the run then completes, and its wait is in its Result, its row and the
// metric under reason operator.
func TestThrottleOperatorPause(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	insertOldKeys(t, pool, 300)
	if err := reaperpause.Set(ctx, pool, reaperpause.State{PausedAt: time.Now(), PausedBy: "alice", Note: "test", ActionID: 1}); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, func(s *Settings) {
		s.BatchSize = 100
		s.Throttle.PauseMin, s.Throttle.PauseMax = time.Millisecond, 10*time.Millisecond
	})
	svc.signals.decided.Init(t)
	done := runAsync(svc)
	holdsBatches(t, svc, pool, 3, throttle.ReasonOperator)
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys`); n != 300 {
		t.Fatalf("a paused run deleted keys: %d left", n)
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultRunning || r.ThrottleReason != "operator" || r.ThrottledSeconds <= 0 {
		t.Fatalf("a paused run's row: %+v, want running, throttled by operator", r)
	}
	if err := reaperpause.Clear(ctx, pool); err != nil {
		t.Fatal(err)
	}
	end := <-done
	if end.err != nil || !end.res.Complete || end.res.Deleted != 300 || end.res.ThrottleReason != "operator" || end.res.Throttled <= 0 {
		t.Fatalf("run after the resume: %+v, %v", end.res, end.err)
	}
	if v := testutil.ToFloat64(svc.metrics.throttled.WithLabelValues("operator")); v <= 0 {
		t.Errorf("idemd_reaper_throttled_seconds_total{reason=operator} = %v", v)
	}
	for _, r := range throttle.Reasons() {
		if r != throttle.ReasonOperator && testutil.ToFloat64(svc.metrics.throttled.WithLabelValues(string(r))) != 0 {
			t.Errorf("reason %s counted without a wait for it", r)
		}
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultComplete || r.ThrottleReason != "operator" || r.ThrottledSeconds <= 0 || r.Deleted != 300 {
		t.Fatalf("the run's row: %+v", r)
	}
}

// --critical-load stops a run cleanly between batches. The WAL rate is
// known from the second reading on, so with a ceiling of one byte a second
// the run commits its first batch and stops before its second. The SQL
// oracle: the lease is released, the row says critical_load with the
// measurement, exactly the first batch's keys are gone and each unfinished
// key among them has its review, and the rest are all still there.
func TestThrottleCriticalLoadStopsCleanly(t *testing.T) {
	pool := dbtest.NewPool(t)
	ids := insertOldKeys(t, pool, 300)
	svc := newService(t, pool, func(s *Settings) {
		s.BatchSize = 100
		s.Throttle.CriticalLoad = "wal_rate=1"
	})
	res, err := svc.RunOnce(context.Background())
	if err != nil || res.Complete || res.StopReason != stopCriticalLoad || res.Batches != 1 || res.Deleted != 100 || !strings.Contains(res.StopDetail, "wal_rate") {
		t.Fatalf("run: %+v, %v; want one batch, then stop_reason critical_load", res, err)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM idemd_leases WHERE name = $1 AND expires_at > clock_timestamp()`, LeaseName); n != 0 {
		t.Errorf("%d live leases after the stop", n)
	}
	r := lastRun(t, pool)
	if r.Result != runhistory.ResultIncomplete || r.StopReason != stopCriticalLoad || !strings.Contains(r.Error, "wal_rate") || r.Deleted != 100 || r.FinishedAt == nil {
		t.Errorf("the run's row: %+v", r)
	}
	// The first batch takes the oldest keys: ids[:100] are gone, every
	// other one is there.
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys WHERE id = ANY($1)`, ids[:100]); n != 0 {
		t.Errorf("%d keys of the committed batch are still there", n)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys WHERE id = ANY($1)`, ids[100:]); n != 200 {
		t.Errorf("%d of the 200 keys after the batch are left", n)
	}
	// Every third key is unfinished: its review was created with it.
	if n := queryInt(t, pool, `SELECT count(DISTINCT key_id) FROM idempotency_key_reviews WHERE key_id = ANY($1)`, ids[:100]); n != 33 {
		t.Errorf("%d reviews for the 33 unfinished keys deleted", n)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_key_reviews WHERE key_id = ANY($1)`, ids[100:]); n != 0 {
		t.Errorf("%d reviews for keys not deleted", n)
	}
}

// The throttle engages when a streaming standby falls behind, and lets the
// run go on once it catches up: on a private cluster with a standby made by
// pg_basebackup, the standby's replay is paused (pg_wal_replay_pause), the
// run's first batch puts it behind, and the run waits (replica_lag or
// replica_bytes) without deleting until the replay is resumed; then it
// completes. It fails if the throttle never engages. Runs as idemd_runtime,
// which sees the standby's position through deploy/sql/roles.sql's grant.
func TestThrottleReplicaLag(t *testing.T) {
	ctx := context.Background()
	// No autovacuum on this private cluster: a VACUUM of the keys just
	// inserted writes a megabyte of WAL (the visibility map, full-page
	// images), and landing between the standby's pause and the run's first
	// reading it put the standby over the limit before the first batch.
	primary := dbtest.StartClusterWith(t, dbtest.ClusterOptions{Settings: []string{"autovacuum=off"}})
	pool := privateDB(t, primary)
	standby := primary.StartStandby(t)
	spool, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spool.Close)

	insertOldKeys(t, pool, 3000)
	// The standby replays the keys, then stops replaying.
	var target string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Minute, "the standby to replay the keys", func() bool {
		var caught bool
		if err := spool.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, target).Scan(&caught); err != nil {
			t.Fatal(err)
		}
		return caught
	})
	if _, err := spool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}

	svc := newService(t, pool, func(s *Settings) {
		s.BatchSize = 1000
		// A 1000-key batch writes far more WAL than 16 kB (its delete
		// records alone), so one batch puts the paused standby over.
		s.Throttle.MaxLag, s.Throttle.MaxLagBytes = time.Second, "16kB"
		s.Throttle.PauseMin, s.Throttle.PauseMax = 5*time.Millisecond, 50*time.Millisecond
	})
	svc.signals.decided.Init(t)
	done := runAsync(svc)
	d := waitThrottled(t, svc, throttle.ReasonReplicaBytes, throttle.ReasonReplicaLag)
	t.Logf("throttled: %s", d.Detail)
	holdsBatches(t, svc, pool, 3, throttle.ReasonReplicaBytes, throttle.ReasonReplicaLag)
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys`); n == 3000 || n == 0 {
		t.Fatalf("%d keys left while throttled: want the first batch deleted and the rest waiting", n)
	}
	// The same standby read directly, as --replica-url-file gives it: it
	// is counted beside the primary's view of it, and is behind too.
	file := filepath.Join(t.TempDir(), "replicas")
	if err := os.WriteFile(file, []byte("# the paused standby\n"+standby.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reps, closeReps, err := OpenReplicas(ctx, &ThrottleSettings{ReplicaURLFile: file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeReps()
	direct := (&throttle.Reader{Primary: pool, Replicas: reps, WatchReplicas: true}).Read(ctx)
	if direct.Err != nil || direct.Replicas != 2 || direct.LagBytes <= 0 || direct.Lag <= 0 {
		t.Fatalf("reading the paused standby directly too: %+v", direct)
	}
	if _, err := spool.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	end := <-done
	if end.err != nil || !end.res.Complete || end.res.Deleted != 3000 || end.res.Throttled <= 0 ||
		(end.res.ThrottleReason != string(throttle.ReasonReplicaBytes) && end.res.ThrottleReason != string(throttle.ReasonReplicaLag)) {
		t.Fatalf("run after the standby resumed: %+v, %v", end.res, end.err)
	}
	r := lastRun(t, pool)
	if r.Result != runhistory.ResultComplete || r.ThrottledSeconds <= 0 || r.ThrottleReason != end.res.ThrottleReason {
		t.Fatalf("the run's row: %+v", r)
	}
}

// privateDB is a migrated database on a private cluster, and a pool on it
// as idemd_runtime (deploy/sql/roles.sql's grants): for the tests that
// read or change what the whole server does (its replicas, its WAL, its
// checkpoints), which the shared test server's other databases would
// disturb.
func privateDB(t *testing.T, c *dbtest.Cluster) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	dbURL := c.NewMigratedDatabase(t, "idemd_reaper_throttle")
	pool, err := pgxpool.New(ctx, dbtest.RuntimeURL(dbURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The throttle's flags are checked with the rest: the defaults pass, and
// every bad value is reported in its flag's words, a replica URL without
// repeating it (it may hold a password).
func TestThrottleSettingsCheck(t *testing.T) {
	s := DefaultSettings()
	if p := s.Check(); len(p) != 0 {
		t.Fatalf("defaults: %v", p)
	}
	if l := s.Throttle.limits(); l.MaxLag != time.Second || l.MaxLagBytes != 64<<20 ||
		l.MaxLoad != (throttle.Load{WALRateAuto: true, CommitLatencyAuto: true}) || !l.CriticalLoad.IsZero() {
		t.Fatalf("default limits %+v", l)
	}
	s.Throttle = ThrottleSettings{
		MaxLag: -time.Second, MaxLagBytes: "lots", MaxLoad: "commit_latency=50ms", CriticalLoad: "commit_latency=10ms,iops=3",
		PauseMin: time.Second, PauseMax: time.Millisecond, ReplicaURLs: []string{"postgres://u:s3cret@host:notaport/db"},
	}
	p := strings.Join(s.Check(), "\n")
	for _, want := range []string{"--max-lag must not be negative", "--max-lag-bytes", "--critical-load", "unknown load signal", "--pause-max", "--replica-url"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "s3cret") {
		t.Errorf("a problem repeats the replica URL's password:\n%s", p)
	}
	s.Throttle.CriticalLoad = "commit_latency=10ms"
	if p := strings.Join(s.Check(), "\n"); !strings.Contains(p, "commit_latency must be above --max-load's") {
		t.Errorf("critical below max accepted:\n%s", p)
	}
}

// A --replica-url without a password logs in with the primary pool's
// credentials (its BeforeConnect: the credential files a rotation
// rewrites), since a physical standby has the primary's roles; one with
// a password of its own keeps it.
func TestReplicaURLTakesThePrimarysCredentials(t *testing.T) {
	ctx := context.Background()
	server, err := url.Parse(dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	user := server.User.Username()
	password, _ := server.User.Password()
	server.User = url.User(user)
	withoutPassword := server.String()
	server.User = url.UserPassword(user, cmp.Or(password, "its-own"))
	withPassword := server.String()

	primary, err := pgxpool.ParseConfig(withoutPassword)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := 0
	primary.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		cc.Password = password // what a credential file would hold
		return nil
	}
	reps, closeReps, err := OpenReplicas(ctx, &ThrottleSettings{ReplicaURLs: []string{withoutPassword, withPassword}}, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer closeReps()
	for i, r := range reps {
		if err := r.Pool.Ping(ctx); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		mu.Lock()
		got := calls
		mu.Unlock()
		if want := 1; got != want {
			t.Errorf("after connecting to replica %d (password in its URL: %v): the primary's BeforeConnect ran %d times, want %d", i, i == 1, got, want)
		}
	}
}

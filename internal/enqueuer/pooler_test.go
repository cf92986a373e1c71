package enqueuer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/pgbouncertest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// pooledPool is a pool through a real PgBouncer in transaction mode, built
// the way the daemons build it with --pooler transaction.
func pooledPool(t *testing.T) (*pgxpool.Pool, *pgbouncertest.Bouncer, string, string) {
	t.Helper()
	dbURL := dbtest.NewDatabase(t)
	db := pgbouncertest.DatabaseName(t, dbURL)
	b := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 4})
	pool, _, err := daemon.NewPool(context.Background(), config.Database{DatabaseURL: b.URL(db, "postgres"), Pooler: config.PoolerTransaction}, "idemd-enqueuer", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, b, db, dbURL
}

// TestDeafListenerIsDetected: LISTEN through a transaction-mode pooler
// succeeds and then hears nothing. The self-check finds it: listener_up
// stays 0, the failures are counted, and staged rows still move by polling.
func TestDeafListenerIsDetected(t *testing.T) {
	pool, b, db, _ := pooledPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) {
		s.SweepInterval, s.ListenDatabaseURL = 200*time.Millisecond, b.URL(db, "postgres")
		s.ListenerCheckInterval, s.ListenerCheckTimeout = 100*time.Millisecond, 300*time.Millisecond
	})
	s.signals.listenerCheckFailed.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	// Two failed self-checks.
	_ = s.signals.listenerCheckFailed.WaitOrTimeout(t)
	_ = s.signals.listenerCheckFailed.WaitOrTimeout(t)
	if up := testutil.ToFloat64(s.metrics.listenerUp); up != 0 {
		t.Fatalf("listener_up %v for a listener that hears nothing", up)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 2*time.Minute, "the row to move by polling", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 1 })
	if n := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("notify")); n != 0 {
		t.Fatalf("%v notify wake-ups through a deaf listener", n)
	}
}

// TestListenOnDirectURLBehindPooler: the pool goes through PgBouncer in
// transaction mode and the listener uses a direct connection, as the docs
// recommend: notifications wake the service (no polling with an hour-long
// interval), and the pool's server connections keep no LISTEN, prepared
// statement or setting afterwards.
func TestListenOnDirectURLBehindPooler(t *testing.T) {
	pool, b, db, dbURL := pooledPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.SweepInterval, s.ListenDatabaseURL = time.Hour, dbURL })
	s.signals.listenerUp.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.signals.listenerUp.WaitOrTimeout(t)
	for i := range 3 {
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, 2*time.Minute, "the row to move", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == int64(i+1) })
	}
	if n := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("poll")); n != 0 {
		t.Fatalf("%v poll wake-ups with an hour-long interval", n)
	}
	if n := testutil.ToFloat64(s.metrics.wakeups.WithLabelValues("notify")); n < 1 {
		t.Fatal("no notify wake-up")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	leaks, err := b.Leaks(ctx, db, "postgres", "application_name")
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) > 0 {
		t.Fatalf("server connections were left with session state: %q", leaks)
	}
}

// TestPollOnlyGauge: a service told not to listen says so in its metrics.
func TestPollOnlyGauge(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	s := newService(t, pool, func(s *Settings) { s.PollOnly, s.SweepInterval = true, 100*time.Millisecond })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx) //nolint:errcheck
	testwait.Until(t, time.Minute, "poll_only 1", func() bool { return testutil.ToFloat64(s.metrics.pollOnly) == 1 })
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{}')`); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Minute, "the row to move", func() bool { return count(t, pool, "SELECT count(*) FROM river_job") == 1 })
	if up := testutil.ToFloat64(s.metrics.listenerUp); up != 0 {
		t.Fatalf("listener_up %v without a listener", up)
	}
}

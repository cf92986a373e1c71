package reaper

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// A reaper run on a network that went silent fails within its bound,
// naming the call the database did not answer (the lease), instead of
// blocking; once the network forwards again, the next run takes the lease
// and deletes what is past retention.
func TestRunEndsInABlackHoleAndReapsAfterIt(t *testing.T) {
	const bound = 300 * time.Millisecond
	direct, pool, hole, calls := blackhole.Database(t, bound)
	svc, err := New(Config{Settings: testSettings(), Pool: pool, Calls: calls,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	run := func() (res *Result, err error) {
		testwait.Returns(t, 100*bound, "a reaper run", func() { res, err = svc.RunOnce(context.Background()) })
		return res, err
	}
	if _, err := run(); err != nil {
		t.Fatal(err)
	}

	hole.BlackHole(tcpproxy.HoleOptions{})
	old := dbNow(t, direct).Add(-testSettings().Retention - time.Hour)
	for _, name := range []string{"old-1", "old-2"} {
		insertKey(t, direct, keySpec{name: name, createdAt: old})
	}
	_, err = run()
	if !dbcall.IsTimeout(err) {
		t.Fatalf("a run in the black hole returned %v, want a database timeout", err)
	}
	if f := calls.Fault(); f == nil || !strings.Contains(f.Error(), "reaper") {
		t.Fatalf("Fault (what /readyz says) = %v, want the reaper's call", f)
	}

	hole.Heal()
	testwait.Until(t, time.Minute, "the keys past retention deleted after the black hole", func() bool {
		run() //nolint:errcheck // a run may meet a pooled connection the hole silenced
		var n int
		if err := direct.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'old-%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if f := calls.Fault(); f != nil {
		t.Fatalf("the database answers again but Fault still says %v", f)
	}
}

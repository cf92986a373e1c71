package dbstats

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// An exporter pass on a network that went silent fails within its bound,
// naming the call the database did not answer (the lease), instead of
// blocking; once the network forwards again it exports again.
func TestPassEndsInABlackHoleAndExportsAfterIt(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	hole, pool := blackhole.Pool(t, dbtest.NewDatabase(t), bound)
	calls := blackhole.Calls(pool, bound)
	svc, err := New(Config{Settings: testSettings(), Pool: pool, Calls: calls, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	pass := func() (res *Result, err error) {
		testwait.Returns(t, 100*bound, "an exporter pass", func() { res, err = svc.RunOnce(context.Background()) })
		return res, err
	}
	if res, err := pass(); err != nil || !res.Exporting {
		t.Fatalf("first pass: %+v, %v", res, err)
	}

	hole.BlackHole(tcpproxy.HoleOptions{})
	_, err = pass()
	if !dbcall.IsTimeout(err) {
		t.Fatalf("a pass in the black hole returned %v, want a database timeout", err)
	}
	if f := calls.Fault(); f == nil || !strings.Contains(f.Error(), "db-stats lease: acquire") {
		t.Fatalf("Fault (what /readyz says) = %v, want the db-stats lease", f)
	}

	hole.Heal()
	testwait.Until(t, time.Minute, "an export after the black hole", func() bool {
		res, err := pass()
		return err == nil && res.Exporting
	})
	if f := calls.Fault(); f != nil {
		t.Fatalf("the database answers again but Fault still says %v", f)
	}
}

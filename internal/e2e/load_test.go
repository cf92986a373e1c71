//go:build e2e

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"idemd/internal/dbtest"
	"idemd/internal/e2e/load"
)

// TestLoad is the load run (a few minutes): IDEMD_LOAD=1 enables it. The
// same run is the "e2e" suite of `make bench`.
func TestLoad(t *testing.T) {
	if os.Getenv("IDEMD_LOAD") != "1" {
		t.Skip("load run skipped: set IDEMD_LOAD=1 to run it (about 2.5 minutes), or run `make bench` (suite e2e)")
	}
	d := time.Minute
	if s := os.Getenv("IDEMD_LOAD_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("IDEMD_LOAD_DURATION: %v", err)
		}
	}
	rep, err := load.Load(context.Background(), dbtest.ServerURL(t), load.LoadOptions{Duration: d, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []load.Phase{rep.Without, rep.With} {
		t.Logf("%-45s %6.0f req/s  p50 %-10s p99 %-10s max %-10s statuses %v gave up %d errors %d River jobs %d open keys %d",
			ph.Name, ph.Throughput, ph.P50, ph.P99, ph.Max, ph.Status, ph.GaveUp, ph.Errors, ph.RiverJobs, ph.OpenKeys)
	}
	t.Logf("with daemons / without: throughput %.2f×, p99 %.2f×", rep.ThroughputRatio(), rep.P99Ratio())
	if rep.With.RiverJobs == 0 {
		t.Error("the daemons phase moved no staged job into River")
	}
}

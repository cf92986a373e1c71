//go:build e2e

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/load"
)

// TestLoad is the load run (several minutes): IDEMD_LOAD=1 enables it. The
// same run is the "e2e" suite of `make bench`.
func TestLoad(t *testing.T) {
	if os.Getenv("IDEMD_LOAD") != "1" {
		t.Skip("load run skipped: set IDEMD_LOAD=1 to run it (about 9 minutes; IDEMD_LOAD_DURATION=30s for about 4), or run `make bench` (suite e2e)")
	}
	d := 90 * time.Second // the e2e suite's
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
	for _, ph := range append(rep.Cost, rep.Conflicts...) {
		t.Logf("%-45s %-20s %2d clients %6.0f req/s  p50 %-10s p99 %-10s DB CPU %s/req WAL %.0f B/req 409s %.2f %% statuses %v gave up %d errors %d River jobs %d open keys %d",
			ph.Name, ph.Isolation, ph.Clients, ph.Throughput, ph.P50, ph.P99, ph.CPUPerRequest(), ph.WALPerRequest(), 100*ph.ConflictRate(),
			ph.Status, ph.GaveUp, ph.Errors, ph.RiverJobs, ph.OpenKeys)
	}
	for i := 1; i < len(rep.Cost); i++ {
		tp, p99 := load.Ratio(rep.Cost[i], rep.Cost[i-1])
		rtp, rp99 := load.RoundRatios(rep.Cost[i], rep.Cost[i-1])
		t.Logf("%s / %s: throughput %.2f× (rounds %.2f), p99 %.2f× (rounds %.2f)", rep.Cost[i].Name, rep.Cost[i-1].Name, tp, rtp, p99, rp99)
	}
	if c, ok := rep.Find(load.ConfigC.Name); ok && c.RiverJobs == 0 {
		t.Error("the staging configuration moved no staged job into River")
	}
	if b, ok := rep.Find(load.ConfigB.Name); ok && b.RiverJobs == 0 {
		t.Error("the InsertTx configuration inserted no River job")
	}
}

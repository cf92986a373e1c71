package enqueuerbench

import (
	"context"
	"strings"
	"testing"
	"time"

	"idemd/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// BenchmarkDrain runs the whole comparison at a small size; `make bench`
// runs it at full size through the report command.
func BenchmarkDrain(b *testing.B) {
	admin := dbtest.ServerURL(b)
	for range b.N {
		rep, err := Run(context.Background(), admin, Options{Jobs: 20_000, LatencyDuration: 2 * time.Second, LatencyRate: 500, Logf: b.Logf})
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range rep.Throughput {
			b.ReportMetric(t.JobsPerSec, "jobs/s:"+strings.NewReplacer(" ", "_", ",", "").Replace(t.Name))
		}
	}
}

// TestRunSmall keeps the benchmark code honest in the normal test run: every
// variant must move every row exactly once (Run verifies with SQL).
func TestRunSmall(t *testing.T) {
	rep, err := Run(context.Background(), dbtest.ServerURL(t), Options{Jobs: 3000, LatencyRate: 200, LatencyDuration: 500 * time.Millisecond, SkipPolling: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Throughput) != 6 || len(rep.Latency) != 1 || rep.Latency[0].Jobs == 0 {
		t.Fatalf("incomplete report: %+v", rep)
	}
}

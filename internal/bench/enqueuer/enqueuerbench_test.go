package enqueuerbench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/pgbouncer"
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

// TestRunSmallThroughPgBouncer runs the pooler variants at a small size: the
// drain through a real pgbouncer in transaction mode moves every row exactly
// once, and both pooled latency runs (listener on a direct connection, and
// poll-only) see every job.
func TestRunSmallThroughPgBouncer(t *testing.T) {
	if pgbouncer.Binary() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no pgbouncer binary (CI=true); scripts/ensure-pgbouncer.sh installs it")
		}
		t.Skip("no pgbouncer binary; run scripts/ensure-pgbouncer.sh")
	}
	rep, err := Run(context.Background(), dbtest.ServerURL(t), Options{Jobs: 3000, LatencyRate: 200, LatencyDuration: 500 * time.Millisecond,
		SkipArticle: true, SkipPolling: true, Pooler: true})
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, x := range rep.Throughput {
		if strings.Contains(x.Name, "PgBouncer") {
			pooled++
		}
	}
	for _, l := range rep.Latency {
		if strings.Contains(l.Name, "PgBouncer") && l.Jobs > 0 {
			pooled++
		}
	}
	if pooled != 3 {
		t.Fatalf("want 1 pooled drain and 2 pooled latency runs, got %d: %+v", pooled, rep)
	}
}

// TestRunSnapshotSmall keeps the held-snapshot benchmark honest in the
// normal test run: both runs move every staged row exactly once (RunSnapshot
// checks it with SQL) and report every period.
func TestRunSnapshotSmall(t *testing.T) {
	rep, err := RunSnapshot(context.Background(), dbtest.ServerURL(t), SnapshotOptions{
		Rate: 200, Duration: 2 * time.Second, Interval: time.Second, Warmup: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []SnapshotRun{rep.Without, rep.With} {
		if len(run.Intervals) != 2 || run.Jobs < 200 {
			t.Fatalf("incomplete run: %+v", run)
		}
		for _, iv := range run.Intervals {
			if iv.Jobs == 0 || iv.Batches == 0 {
				t.Fatalf("empty period: %+v", iv)
			}
		}
	}
}

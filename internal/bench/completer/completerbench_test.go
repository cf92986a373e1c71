package completerbench

import (
	"context"
	"os"
	"testing"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestSmall runs the whole benchmark at a small size, so it cannot rot.
func TestSmall(t *testing.T) {
	rep, err := Run(context.Background(), dbtest.ServerURL(t), Options{Keys: 50_000, QueryRuns: 5, DrainKeys: 200, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unfinished != 50 || rep.Ours.Rows != 50 || rep.Article.Rows != 50 {
		t.Fatalf("unfinished %d, rows %d/%d", rep.Unfinished, rep.Ours.Rows, rep.Article.Rows)
	}
	t.Log("\n" + rep.String())
}

// TestFullReport is the benchmark (2M keys, 10k drained); it takes
// minutes, so it runs only with IDEMD_COMPLETER_BENCH_FULL=1.
func TestFullReport(t *testing.T) {
	if os.Getenv("IDEMD_COMPLETER_BENCH_FULL") == "" {
		t.Skip("set IDEMD_COMPLETER_BENCH_FULL=1 to run the full benchmark")
	}
	rep, err := Run(context.Background(), dbtest.ServerURL(t), Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
}

func BenchmarkCompleter(b *testing.B) {
	for b.Loop() {
		rep, err := Run(context.Background(), dbtest.ServerURL(b), Options{Keys: 100_000, QueryRuns: 10, DrainKeys: 300})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.Ours.Median.Microseconds()), "candidate-µs")
		b.ReportMetric(float64(rep.Article.Median.Microseconds()), "article-µs")
		b.ReportMetric(rep.Speedup, "speedup")
		b.ReportMetric(rep.ReplaysPerSecond, "replays/s")
	}
}

package adoptionbench_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemd/idemd/clients/clienttest"
	adoptionbench "github.com/idemd/idemd/internal/bench/adoption"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestDrainFinishesEveryKeyOnce drains a few keys abandoned at each of the
// article's recovery points through the Ruby API with the completer at its
// defaults (--request-encoding form added). The end state is read from the
// API's tables: every key finished with 201, none given up, one ride and
// one charge per key, and the API logged at least one replay per key.
// Timing is the benchmark's business (internal/bench/report's adoption
// suite), not the test's.
func TestDrainFinishesEveryKeyOnce(t *testing.T) {
	opts := adoptionbench.Options{
		Keys:         12,
		Users:        3,
		Root:         clienttest.Root(t),
		Ruby:         clienttest.Ruby(t),
		CompleterBin: testbin.Build(t, "github.com/idemd/idemd/cmd/completer"),
		Timeout:      4 * time.Minute,
		Logf:         t.Logf,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := adoptionbench.DrainWith(ctx, dbtest.ServerURL(t), opts, adoptionbench.Defaults)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	if d.Replays < d.Keys || d.Statuses[201] != d.Keys {
		t.Fatalf("the API answered %d replays %v, want a 201 for each of the %d keys", d.Replays, d.Statuses, d.Keys)
	}
}

// TestFullRun runs both drains at the benchmark's size and logs the ratios
// (IDEMD_ADOPTION_BENCH_KEYS=90 go test -run TestFullRun -v).
func TestFullRun(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("IDEMD_ADOPTION_BENCH_KEYS"))
	if n <= 0 {
		t.Skip("IDEMD_ADOPTION_BENCH_KEYS not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	res, err := adoptionbench.Run(ctx, dbtest.ServerURL(t), adoptionbench.Options{
		Keys: n, Root: clienttest.Root(t), Ruby: clienttest.Ruby(t),
		CompleterBin: testbin.Build(t, "github.com/idemd/idemd/cmd/completer"), Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []adoptionbench.Drain{res.Serial, res.Defaults} {
		if err := d.Check(); err != nil {
			t.Errorf("%v: %v", d.Args, err)
		}
		t.Logf("%v: %s, %d replays %v", d.Args, d.Elapsed, d.Replays, d.Statuses)
	}
	t.Logf("time %.2f×, replays %.2f×, target met: %v", res.TimeRatio(), res.ReplayRatio(), res.Met())
}

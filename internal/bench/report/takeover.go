package benchreport

import (
	"context"
	"fmt"
	"os"

	enqueuerbench "github.com/idemd/idemd/internal/bench/enqueuer"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// Takeover runs the takeover suite (internal/bench/enqueuer, takeover.go):
// two enqueuer processes, the drainer SIGKILLed, the time until a row
// staged right after the kill is in River. The anchor is the standby's
// --takeover-interval (25 ms): a takeover waits for the standby's next
// attempt, half an interval on average; with the shortest interval
// (5 ms) it is about as fast as a wait in pg_advisory_lock, at 200
// attempts a second per standby. IDEMD_BENCH_TAKEOVER_BEFORE names
// another enqueuer binary (an earlier build) measured in the same rounds.
func Takeover(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	root, err := system.ModuleRoot(ctx)
	if err != nil {
		return fmt.Errorf("takeover suite: %w", err)
	}
	bins := []enqueuerbench.TakeoverBinary{{Name: "this build"}, {Name: "this build, --takeover-interval 5ms", Args: []string{"--takeover-interval=5ms"}}}
	if before := os.Getenv("IDEMD_BENCH_TAKEOVER_BEFORE"); before != "" {
		bins = append(bins, enqueuerbench.TakeoverBinary{Name: "IDEMD_BENCH_TAKEOVER_BEFORE", Path: before})
	}
	res, err := enqueuerbench.RunTakeover(ctx, adminURL, enqueuerbench.TakeoverOptions{Binaries: bins, Rounds: scale.n(20), Root: root, Logf: logf})
	if err != nil {
		return fmt.Errorf("takeover suite: %w", err)
	}
	interval := float64(enqueuer.DefaultSettings().TakeoverInterval)
	for _, r := range res {
		row := Row{Suite: "takeover", Name: fmt.Sprintf("SIGKILLed drainer to the next staged row in River, %d takeovers: %s", len(r.Samples), r.Name),
			Value: fmt.Sprintf("p50 %s, p90 %s, max %s", Dur(r.P50), Dur(r.P90), Dur(r.Max)),
			Ratio: Ratio(float64(r.P50)/interval, "--takeover-interval (p50)")}
		if r.Name != res[0].Name {
			row.Ratio = Join(row.Ratio, Ratio(float64(r.P50)/float64(res[0].P50), "this build (p50)"))
		}
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

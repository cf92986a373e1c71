package benchreport

import (
	"context"
	"fmt"
	"time"

	reaperbench "github.com/idemd/idemd/internal/bench/reaper"
)

// ReaperStandby runs the reaper with a streaming standby (on a private
// cluster it starts itself, so adminURL is not used) and appends a row per
// configuration: 20M keys at scale 1, the full suite's 10M reaped
// (docs/benchmarks/reaper.md, "The throttle, with a streaming standby").
// One round each: at that size a round of the suite takes most of an hour.
func ReaperStandby(ctx context.Context, _ string, scale Scale, logf func(string, ...any), rep *Report) error {
	res, err := reaperbench.RunStandby(ctx, reaperbench.StandbyOptions{Keys: scale.n(20_000_000), Logf: logf})
	if err != nil {
		return fmt.Errorf("reaper-standby suite: %w", err)
	}
	for i, c := range res.Configs {
		r := c.Rounds[0]
		done := ""
		if c.Incomplete > 0 {
			done = fmt.Sprintf(" (%d of %d rounds incomplete: %s)", c.Incomplete, len(c.Rounds), r.StopReason)
		}
		row := Row{Suite: "reaper-standby", Name: fmt.Sprintf("delete %d of %d keys under %d inserts/s with a standby: %s", r.Deleted, res.Keys, res.InsertRate, c.Name),
			Value: fmt.Sprintf("%.0f keys/s%s, %.0f MB of WAL (medians of %d rounds); standby lag max %s / %.1f MB, over 1s in %.1f%% of samples; round 1: throttled %s, paced %s, WAL %.2f-%.2f MiB/s over any 10 s, %d requested checkpoints, insert p50 %s vs %s, p99 %s vs %s before",
				c.KeysPerSecMedian, done, float64(c.WALMedian)/1e6, len(c.Rounds), c.LagMax.Round(time.Millisecond), float64(c.LagMaxBytes)/1e6, 100*c.LagOver1s,
				r.Throttled.Round(time.Millisecond), r.Paced.Round(time.Millisecond), r.WALWindowMin/(1<<20), r.WALWindowMax/(1<<20), r.RequestedCheckpoints,
				Dur(r.During.P50), Dur(r.Before.P50), Dur(r.During.P99), Dur(r.Before.P99)),
			Ratio: Ratio(c.P99Median, "insert p99 before, median of rounds"),
			// The standby target: replay lag under the default --max-lag
			// (1 s) for at least 99 % of the run.
			Target: Goal("lag ≤ 1 s for ≥ 99 % of the run", c.LagOver1s <= 0.01),
		}
		if i > 0 {
			row.Ratio = Join(row.Ratio, Ratio(c.VsFirstMedian, "keys/s of "+res.Configs[0].Name))
		}
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

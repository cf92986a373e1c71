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
func ReaperStandby(ctx context.Context, _ string, scale Scale, logf func(string, ...any), rep *Report) error {
	res, err := reaperbench.RunStandby(ctx, reaperbench.StandbyOptions{Keys: scale.n(20_000_000), Logf: logf})
	if err != nil {
		return fmt.Errorf("reaper-standby suite: %w", err)
	}
	for _, r := range res.Rows {
		done := ""
		if !r.Complete {
			done = " (incomplete: " + r.StopReason + ")"
		}
		row := Row{Suite: "reaper-standby", Name: fmt.Sprintf("delete %d of %d keys under %d inserts/s with a standby: %s", r.Deleted, res.Keys, res.InsertRate, r.Name),
			Value: fmt.Sprintf("%.0f keys/s%s, %.0f MB of WAL; standby lag max %s / %.1f MB, over 1s in %.1f%% of samples; throttled %s; insert p99 %s vs %s before",
				r.KeysPerSec, done, float64(r.WALBytes)/1e6, r.LagMax.Round(time.Millisecond), float64(r.LagMaxBytes)/1e6, 100*r.LagOver1s,
				r.Throttled.Round(time.Millisecond), Dur(r.During.P99), Dur(r.Before.P99)),
			Ratio: Ratio(r.P99Ratio, "insert p99 before"),
			// The standby target: replay lag under the default --max-lag
			// (1 s) for at least 99 % of the run.
			Target: Goal("lag ≤ 1 s for ≥ 99 % of the run", r.LagOver1s <= 0.01),
		}
		if len(res.Rows) > 0 && res.Rows[0].KeysPerSec > 0 && r.Name != res.Rows[0].Name {
			row.Ratio = Join(row.Ratio, Ratio(r.KeysPerSec/res.Rows[0].KeysPerSec, "keys/s of the defaults without throttle"))
		}
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

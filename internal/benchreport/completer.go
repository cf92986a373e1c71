package benchreport

import (
	"context"
	"fmt"
	"time"

	"idemd/internal/completer/completerbench"
)

// Completer runs the completer suite: the candidate query against the
// article's (same table, same run) and a drain of abandoned keys through the
// real Rocket Rides API.
func Completer(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	res, err := completerbench.Run(ctx, adminURL, completerbench.Options{
		Keys:      scale.n(2_000_000),
		DrainKeys: scale.n(10_000),
		Logf:      logf,
	})
	if err != nil {
		return fmt.Errorf("completer suite: %w", err)
	}
	name := fmt.Sprintf("candidate query, %d keys, %d unfinished, LIMIT %d", res.Keys, res.Unfinished, res.BatchSize)
	rep.Rows = append(rep.Rows,
		Row{Suite: "completer", Name: name + ": article (no partial index)",
			Value: fmt.Sprintf("median %s, p95 %s", Dur(res.Article.Median), Dur(res.Article.P95))},
		Row{Suite: "completer", Name: name + ": idemd (partial index)",
			Value:  fmt.Sprintf("median %s, p95 %s", Dur(res.Ours.Median), Dur(res.Ours.P95)),
			Ratio:  Ratio(res.Speedup, "faster than the article"),
			Target: Goal("≤ 1 ms and ≥ 100×", res.Ours.Median <= time.Millisecond && res.Speedup >= 100)},
		Row{Suite: "completer", Name: "the same, with FOR UPDATE SKIP LOCKED (a claim)",
			Value: fmt.Sprintf("article %s, idemd %s", Dur(res.ArticleLocking.Median), Dur(res.OursLocking.Median)),
			Ratio: Ratio(float64(res.ArticleLocking.Median)/float64(max(res.OursLocking.Median, time.Microsecond)), "faster than the article")},
		Row{Suite: "completer", Name: fmt.Sprintf("drain %d abandoned keys through Rocket Rides (concurrency %d)", res.DrainKeys, res.Concurrency),
			Value: fmt.Sprintf("%s, %.0f replays/s", Dur(res.Drain), res.ReplaysPerSecond)},
	)
	return nil
}

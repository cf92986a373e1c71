package benchreport

import (
	"context"
	"fmt"
	"time"

	completerbench "github.com/idemd/idemd/internal/bench/completer"
)

// Completer runs the completer suite: the candidate query against the
// article's (same table, same run), a drain of abandoned keys through the
// real Rocket Rides API, and the key workload (the API's own SERIALIZABLE
// key updates) on the article's schema and after idemd's migrations.
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
		Row{Suite: "completer", Name: name + ": article (its own indexes)",
			Value: fmt.Sprintf("median %s, p95 %s", Dur(res.Article.Median), Dur(res.Article.P95))},
		Row{Suite: "completer", Name: name + ": idemd (idemd_unfinished_keys)",
			Value:  fmt.Sprintf("median %s, p95 %s", Dur(res.Ours.Median), Dur(res.Ours.P95)),
			Ratio:  Ratio(res.Speedup, "faster than the article"),
			Target: Goal("≤ 1 ms and ≥ 100×", res.Ours.Median <= time.Millisecond && res.Speedup >= 100)},
		Row{Suite: "completer", Name: name + ": alternative, created_at index only",
			Value: fmt.Sprintf("median %s, p95 %s", Dur(res.CreatedAtScan.Median), Dur(res.CreatedAtScan.P95)),
			Ratio: Ratio(float64(res.Article.Median)/float64(max(res.CreatedAtScan.Median, time.Microsecond)), "faster than the article")},
		Row{Suite: "completer", Name: "the same, with FOR UPDATE SKIP LOCKED (a claim)",
			Value: fmt.Sprintf("article %s, idemd %s", Dur(res.ArticleLocking.Median), Dur(res.OursLocking.Median)),
			Ratio: Ratio(float64(res.ArticleLocking.Median)/float64(max(res.OursLocking.Median, time.Microsecond)), "faster than the article")},
		Row{Suite: "completer", Name: fmt.Sprintf("drain %d abandoned keys through Rocket Rides (concurrency %d)", res.DrainKeys, res.Concurrency),
			Value: fmt.Sprintf("%s, %.0f replays/s", Dur(res.Drain), res.ReplaysPerSecond)},
	)

	hot, err := completerbench.RunHot(ctx, adminURL, completerbench.HotOptions{
		Duration: time.Duration(float64(8*time.Second) * float64(max(scale, 0.2))),
		Prefill:  scale.n(200_000),
		Logf:     logf,
	})
	if err != nil {
		return fmt.Errorf("completer suite: key workload: %w", err)
	}
	article := hot.Anchor()
	idemd, ok := hot.Get(completerbench.IdemdVariant.Name)
	if !ok {
		return fmt.Errorf("completer suite: key workload: no %s result", completerbench.IdemdVariant.Name)
	}
	hotValue := func(r completerbench.HotResult) string {
		return fmt.Sprintf("HOT %.1f %% of %d updates, failures %.2f %% (%d of %d), %.0f req/s",
			100*r.HotShare(), r.Updates, 100*r.FailureRate(), r.Failures, r.Commits+r.Failures, r.RequestsPerSecond())
	}
	hotRatio, failRatio := ratioOf(idemd.HotShare(), article.HotShare()), ratioOf(idemd.FailureRate(), article.FailureRate())
	wl := fmt.Sprintf("key workload, %d clients, SERIALIZABLE phases, %d×%s per schema", hot.Clients, hot.Rounds, Dur(idemd.Elapsed/time.Duration(max(hot.Rounds, 1))))
	rep.Rows = append(rep.Rows,
		Row{Suite: "completer", Name: wl + ": article's schema", Value: hotValue(article)},
		Row{Suite: "completer", Name: wl + ": after idemd's migrations", Value: hotValue(idemd),
			Ratio: Join(Ratio(hotRatio, "article HOT share"), Ratio(failRatio, "article failure rate"),
				Ratio(ratioOf(idemd.RequestsPerSecond(), article.RequestsPerSecond()), "article req/s")),
			Target: Goal("HOT ≥ 0.95×, failures ≤ 1.1×", hotRatio >= 0.95 && failRatio <= 1.1)},
	)
	return nil
}

// ratioOf is x/anchor; 1 when both are 0.
func ratioOf(x, anchor float64) float64 {
	if anchor == 0 {
		if x == 0 {
			return 1
		}
		return x / 1e-9
	}
	return x / anchor
}

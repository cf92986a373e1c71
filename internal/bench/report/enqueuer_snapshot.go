package benchreport

import (
	"context"
	"fmt"
	"os"
	"time"

	enqueuerbench "github.com/idemd/idemd/internal/bench/enqueuer"
	"github.com/idemd/idemd/internal/enqueuer"
)

// SnapshotDurationEnv overrides the length of each held-snapshot run of the
// enqueuer suite (a Go duration, e.g. 30s for a smoke run). Unset: 5
// minutes times -scale, at least 20 s; `make bench` (scale 1) runs 5 minutes
// each, twice.
const SnapshotDurationEnv = "IDEMD_BENCH_SNAPSHOT_DURATION"

// snapshotDuration is the length of each held-snapshot run.
func snapshotDuration(scale Scale) (time.Duration, error) {
	if v := os.Getenv(SnapshotDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("%s=%q: want a positive duration such as 5m or 30s", SnapshotDurationEnv, v)
		}
		return d, nil
	}
	return max(time.Duration(float64(5*time.Minute)*float64(scale)), 20*time.Second), nil
}

// enqueuerSnapshot runs issue 16's held-snapshot benchmark (1,000 jobs/s,
// with and without a REPEATABLE READ transaction open the whole time) and
// appends one row per reporting period and the targets: with the snapshot,
// the last period's p99 ≤ 2× the first period's and ≤ 3× the p99 of the run
// without it.
func enqueuerSnapshot(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	d, err := snapshotDuration(scale)
	if err != nil {
		return fmt.Errorf("enqueuer suite: %w", err)
	}
	res, err := enqueuerbench.RunSnapshot(ctx, adminURL, enqueuerbench.SnapshotOptions{Duration: d, Logf: logf})
	if err != nil {
		return fmt.Errorf("enqueuer suite: %w", err)
	}
	name := func(iv enqueuerbench.SnapshotInterval) string {
		return fmt.Sprintf("%d jobs/s, a REPEATABLE READ snapshot held or not, until %s: without / with", res.Rate, iv.End.Round(time.Second))
	}
	for i := range res.With.Intervals {
		w, h := res.Without.Intervals[i], res.With.Intervals[i]
		rep.Rows = append(rep.Rows, Row{Suite: "enqueuer", Name: name(h),
			Value: fmt.Sprintf("batch mean %s / %s, p99 %s / %s, insert p99 %s / %s, dead tuples %d / %d, sweep mean %s / %s, walk from the index start %s / %s",
				Dur(w.MeanBatch), Dur(h.MeanBatch), Dur(w.P99), Dur(h.P99), Dur(w.InsertP99), Dur(h.InsertP99), w.DeadTuples, h.DeadTuples,
				Dur(w.MeanSweep), Dur(h.MeanSweep), Dur(w.StartWalk), Dur(h.StartWalk)),
			Ratio: Ratio(float64(h.P99)/float64(max(w.P99, time.Microsecond)), "p99 without"),
		})
	}
	lvf, lvw := res.LastVsFirst(), res.LastVsWithout()
	rep.Rows = append(rep.Rows, Row{Suite: "enqueuer",
		Name: fmt.Sprintf("held snapshot, %s at %d jobs/s: last period's p99 against the first's and the run without", res.Duration, res.Rate),
		Value: fmt.Sprintf("p99 last %s, first %s, without %s (p50 with %s, without %s)",
			Dur(res.With.Last().P99), Dur(res.With.First().P99), Dur(res.Without.P99), Dur(res.With.P50), Dur(res.Without.P50)),
		Ratio:  Join(Ratio(lvf, "first period"), Ratio(lvw, "without")),
		Target: Goal("≤ 2× first, ≤ 3× without", lvf <= 2 && lvw <= 3),
	})
	if g := res.With.Gaps[enqueuer.GapSwept] + res.Without.Gaps[enqueuer.GapSwept]; g > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("enqueuer: the held-snapshot runs counted %.0f notification gaps (rows only the sweep found)", g))
	}
	return nil
}

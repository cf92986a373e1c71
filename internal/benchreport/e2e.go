package benchreport

import (
	"context"
	"fmt"
	"time"

	"idemd/internal/e2e/load"
)

// E2E runs the end-to-end load run (internal/e2e/load): the Rocket Rides API
// process under closed-loop traffic, alone and then with 2 enqueuers, 2
// completers and the reaper, and appends both phases with the ratio of the
// second to the first (the anchor, measured in the same run).
func E2E(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	d := time.Duration(float64(time.Minute) * float64(scale))
	d = max(d, 10*time.Second)
	res, err := load.Load(ctx, adminURL, load.LoadOptions{Duration: d, Logf: logf})
	if err != nil {
		return fmt.Errorf("e2e suite: %w", err)
	}
	row := func(ph load.Phase) Row {
		return Row{
			Suite: "e2e",
			Name:  fmt.Sprintf("POST /rides, %d clients, %s: %s", res.Concurrency, d, ph.Name),
			Value: fmt.Sprintf("%.0f req/s, p50 %s, p99 %s", ph.Throughput, Dur(ph.P50), Dur(ph.P99)),
		}
	}
	with := row(res.With)
	with.Ratio = Join(Ratio(res.ThroughputRatio(), "throughput alone"), Ratio(res.P99Ratio(), "p99 alone"))
	rep.Rows = append(rep.Rows, row(res.Without), with)
	rep.Notes = append(rep.Notes, fmt.Sprintf("e2e: with the daemons, %d staged receipts reached River during the phase and %d keys were still open at its end (younger than the completers' grace or in backoff).",
		res.With.RiverJobs, res.With.OpenKeys))
	return nil
}

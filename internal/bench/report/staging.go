package benchreport

import (
	"context"
	"fmt"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/load"
)

// Staging runs the staging-throughput phase (internal/testing/e2e/load, staging.go):
// the ride-like staging transaction at 8, 32 and 64 clients with idemd's
// objects and two enqueuers, against the same transaction without idemd's
// objects and against River's InsertTx, all in this run on a private
// server.
func Staging(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	length := max(time.Duration(float64(8*time.Second)*float64(scale)), 4*time.Second)
	res, err := load.Staging(ctx, adminURL, load.StagingOptions{Length: length, Logf: logf})
	if err != nil {
		return fmt.Errorf("staging suite: %w", err)
	}
	for _, p := range res.Phases {
		row := Row{
			Suite: "staging",
			Name:  fmt.Sprintf("ride + staged job, %d clients, %d×%s: %s", p.Clients, p.Runs, length, p.Variant),
			Value: fmt.Sprintf("%.0f commits/s, commit p50 %s, p99 %s", p.CommitsPerSecond(), Dur(p.CommitP50), Dur(p.CommitP99)),
		}
		plain, _ := res.Find(load.StagingPlain, p.Clients)
		river, _ := res.Find(load.StagingRiver, p.Clients)
		floor, _ := res.Find(load.StagingFloor, p.Clients)
		switch p.Variant {
		case load.StagingIdemd:
			row.Value += fmt.Sprintf("; commit to River p50 %s, p99 %s", Dur(p.ToRiverP50), Dur(p.ToRiverP99))
			vsPlain := p.CommitsPerSecond() / max(plain.CommitsPerSecond(), 1)
			vsRiver := p.CommitsPerSecond() / max(river.CommitsPerSecond(), 1)
			row.Ratio = Join(Ratio(vsPlain, "no idemd objects"), Ratio(vsRiver, "River InsertTx"),
				Ratio(p.CommitsPerSecond()/max(floor.CommitsPerSecond(), 1), "copied into River beside"),
				perRunRatios(p.PerRun, plain.PerRun, "no idemd objects"))
			goal, met := "≥0.9× no idemd objects", vsPlain >= 0.9
			if p.Clients == 32 {
				goal, met = goal+", ≥1× River InsertTx", met && vsRiver >= 1
			}
			row.Target = Goal(goal, met)
		case load.StagingRiver:
			row.Ratio = Ratio(p.CommitsPerSecond()/max(plain.CommitsPerSecond(), 1), "no idemd objects")
		case load.StagingIdemdOwnCPU:
			row.Value += fmt.Sprintf("; commit to River p50 %s, p99 %s", Dur(p.ToRiverP50), Dur(p.ToRiverP99))
			row.Ratio = Ratio(p.CommitsPerSecond()/max(plain.CommitsPerSecond(), 1), "no idemd objects")
		case load.StagingFloor:
			row.Ratio = Join(Ratio(p.CommitsPerSecond()/max(plain.CommitsPerSecond(), 1), "no idemd objects"),
				perRunRatios(p.PerRun, plain.PerRun, "no idemd objects"))
		case load.StagingPolled:
			row.Ratio = Join(Ratio(p.CommitsPerSecond()/max(plain.CommitsPerSecond(), 1), "no idemd objects"),
				perRunRatios(p.PerRun, plain.PerRun, "no idemd objects"))
			row.Target = Goal("≥0.9× no idemd objects (the commit path alone)", p.CommitsPerSecond()/max(plain.CommitsPerSecond(), 1) >= 0.9)
		}
		rep.Rows = append(rep.Rows, row)
	}
	// The commit-to-River target is at the highest rate of the run,
	// whichever client count reached it.
	var top load.StagingPhase
	for _, p := range res.Phases {
		if p.Variant == load.StagingIdemd && p.CommitsPerSecond() > top.CommitsPerSecond() {
			top = p
		}
	}
	rep.Rows = append(rep.Rows, Row{Suite: "staging", Name: fmt.Sprintf("commit to River at the run's highest staging rate (%.0f commits/s, %d clients)", top.CommitsPerSecond(), top.Clients),
		Value: fmt.Sprintf("p50 %s, p99 %s", Dur(top.ToRiverP50), Dur(top.ToRiverP99)), Target: Goal("p99 ≤100 ms", top.ToRiverP99 <= 100*time.Millisecond)})
	if own, ok := res.Find(load.StagingIdemdOwnCPU, top.Clients); ok && own.Runs > 0 {
		rep.Rows = append(rep.Rows, Row{Suite: "staging", Name: fmt.Sprintf("the same, %d clients, enqueuers at nice -10 (%.0f commits/s)", own.Clients, own.CommitsPerSecond()),
			Value: fmt.Sprintf("p50 %s, p99 %s", Dur(own.ToRiverP50), Dur(own.ToRiverP99)), Target: Goal("p99 ≤100 ms", own.ToRiverP99 <= 100*time.Millisecond)})
	}
	rep.Rows = append(rep.Rows, Row{Suite: "staging", Name: "two idle enqueuers' transactions on a database where nothing was staged",
		Value: fmt.Sprintf("%.1f a second (%.1f each)", res.IdleTransactionsPerSecond, res.IdleTransactionsPerSecond/2)})
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("staging: measured on %s. Closed-loop clients, each its own connection, run BEGIN; INSERT a ride; stage its receipt job; COMMIT, with no HTTP in between; each (variant, clients) runs twice in rotating order, each run a fresh database, the first %s of a run not measured. Commit to River is a commit's answer to its River job's created_at (set by the enqueuer's insert).", res.Server, time.Second),
	)
	return nil
}

// perRunRatios says how the runs' own ratios spread: the median and range.
func perRunRatios(a, b []float64, label string) string {
	n := min(len(a), len(b))
	if n < 2 {
		return ""
	}
	rs := make([]float64, n)
	for i := range n {
		rs[i] = a[i] / max(b[i], 1)
	}
	lo, hi := rs[0], rs[0]
	for _, r := range rs {
		lo, hi = min(lo, r), max(hi, r)
	}
	return fmt.Sprintf("runs %.2f–%.2f× %s", lo, hi, label)
}

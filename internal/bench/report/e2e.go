package benchreport

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/load"
)

// E2E runs the end-to-end load benchmark (internal/testing/e2e/load): the Rocket
// Rides API process under closed-loop traffic in four configurations, (a)
// no background job, (b) River's InsertTx + the worker, (c) idemd's staging
// + enqueuers + the worker, (d) (c) + completers and reaper, each against
// the one before it, all measured in this run; then the 409 rate of
// requests with distinct keys at 8 and 32 clients for each isolation,
// against the article's protocol measured in the same run.
func E2E(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	d := time.Duration(float64(90*time.Second) * float64(scale))
	d = max(d, 20*time.Second)
	res, err := load.Load(ctx, adminURL, load.LoadOptions{Duration: d, Logf: logf})
	if err != nil {
		return fmt.Errorf("e2e suite: %w", err)
	}
	run := d / time.Duration(res.Rounds)
	for i, ph := range res.Cost {
		row := Row{
			Suite: "e2e",
			Name:  fmt.Sprintf("POST /rides, %d clients, %d×%s: %s", ph.Clients, ph.Runs, run, ph.Name),
			Value: fmt.Sprintf("%.0f req/s, p50 %s, p99 %s; DB CPU %s/req, API process %s/req, daemons %s/req, WAL %.1f kB/req; 409s %.2f %%",
				ph.Throughput, Dur(ph.P50), Dur(ph.P99), msPerRequest(ph.DBCPUOK, ph.CPUPerRequest()), msPerRequest(ph.ProcCPUOK, ph.APICPUPerRequest()), msPerRequest(ph.ProcCPUOK, ph.DaemonCPUPerRequest()),
				ph.WALPerRequest()/1e3, 100*ph.ConflictRate()),
		}
		if i > 0 {
			prev := res.Cost[i-1]
			tp, p99 := load.Ratio(ph, prev)
			label := prev.Name[:3] // "(a)", "(b)", ...
			row.Ratio = Join(Ratio(tp, "throughput "+label), Ratio(p99, "p99 "+label),
				ratioIf(float64(ph.CPUPerRequest())/float64(max(prev.CPUPerRequest(), 1)), "DB CPU/req "+label),
				ratioIf(ph.WALPerRequest()/max(prev.WALPerRequest(), 1), "WAL/req "+label),
				roundRatios(ph, prev, label))
			switch ph.Name {
			case load.ConfigC.Name:
				row.Target = Goal("≥0.9× throughput (b), p99 ≤1.2× (b)", tp >= 0.9 && p99 <= 1.2)
			case load.ConfigD.Name:
				row.Target = Goal("≥0.95× throughput (c)", tp >= 0.95)
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	var article = map[int]load.Phase{}
	for _, ph := range res.Conflicts {
		if ph.Isolation == "article-serializable" {
			article[ph.Clients] = ph
		}
	}
	for _, ph := range res.Conflicts {
		row := Row{
			Suite: "e2e",
			Name:  fmt.Sprintf("409s, distinct keys of one user, %d clients, %s: %s", ph.Clients, run, ph.Isolation),
			Value: fmt.Sprintf("%.2f %% (%d of %d), %.0f req/s, p99 %s", 100*ph.ConflictRate(), ph.Status[409], ph.Requests, ph.Throughput, Dur(ph.P99)),
		}
		if a, ok := article[ph.Clients]; ok && ph.Isolation != "article-serializable" {
			tp, p99 := load.Ratio(ph, a)
			row.Ratio = Join(Ratio(tp, "throughput article"), Ratio(p99, "p99 article"))
			if ph.Isolation == "read-committed" {
				row.Target = Goal("409s ≤0.1 %, throughput ≥1× article", ph.ConflictRate() <= 0.001 && tp >= 1)
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	notes := []string{
		fmt.Sprintf("e2e: measured on %s. Each run is a fresh database and rocketrides process (pool: a connection per client + 4); the first %s of a run is not measured; the cost runs go in %d rounds, in the orders of a balanced Latin square, and are pooled (per-round ratios beside the pooled ones); 5 %% of their requests are abandoned mid-request and 1 rider of 20 is declined (402).", res.Server, res.Warmup, res.Rounds),
		"e2e: DB CPU is utime+stime from /proc/<pid>/stat (on a private cluster: the postmaster and every process it started, exited ones through its cutime/cstime; on a shared server: the backends of the run's database, sampled every 250 ms); pg_stat_statements is not loaded. WAL is pg_current_wal_insert_lsn's advance over the window; a private cluster's window starts with a CHECKPOINT.",
		"e2e: the daemons run at their defaults (2 enqueuers and 2 completers, as deployed; the reaper --schedule \"@every 10s\" instead of the hourly CronJob). The completers' default grace is 5 min, longer than a run: they poll and find nothing due.",
	}
	for _, ph := range res.Cost {
		notes = append(notes, fmt.Sprintf("e2e %s: statuses %v, gave up %d, transport errors %d; after the runs %d River jobs, %d staged jobs not yet moved, %d keys open.",
			ph.Name, ph.Status, ph.GaveUp, ph.Errors, ph.RiverJobs, ph.Staged, ph.OpenKeys))
	}
	rep.Notes = append(rep.Notes, notes...)
	return nil
}

// roundRatios says how the pooled ratios of a to b spread round by round:
// the median and the range of the runs' own ratios.
func roundRatios(a, b load.Phase, label string) string {
	tp, p99 := load.RoundRatios(a, b)
	if len(tp) < 2 {
		return ""
	}
	spread := func(xs []float64) string {
		return fmt.Sprintf("median %.2f×, %.2f-%.2f×", load.Median(xs), slices.Min(xs), slices.Max(xs))
	}
	return fmt.Sprintf("per round (%d): throughput %s %s, p99 %s", len(tp), label, spread(tp), spread(p99))
}

// msPerRequest is a CPU figure per request in milliseconds, or n/a when
// /proc could not be read (ok false).
func msPerRequest(ok bool, d time.Duration) string {
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

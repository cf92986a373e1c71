package ctl

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemd/idemd/internal/runhistory"
)

// ReaperCmd groups what idemctl tells about the reaper.
type ReaperCmd struct {
	Runs ReaperRunsCmd `cmd:"" help:"List the reaper's last runs from its run history (idemd_reaper_runs), whatever mode they ran in: CronJob, --schedule or by hand."`
}

// ReaperRunsCmd lists the reaper's run history, newest first.
type ReaperRunsCmd struct {
	Last int `name:"last" short:"n" default:"20" help:"How many runs to list (the history keeps the newest 1000 of the last 30 days)."`
	Output
}

// Validate implements kong's hook: the count must be usable.
func (c *ReaperRunsCmd) Validate() error {
	if c.Last < 1 || c.Last > 1000 {
		return fmt.Errorf("--last must be between 1 and 1000, got %d", c.Last)
	}
	return nil
}

// Run prints the runs: a run without an end is "running" while its
// process holds the lease and "interrupted" once it does not (runhistory).
func (c *ReaperRunsCmd) Run(ctx context.Context, g *Globals) error {
	runs, err := runhistory.LastRuns(ctx, g.Pool, c.Last)
	if err != nil {
		return err
	}
	if runs == nil {
		runs = []runhistory.Run{}
	}
	if c.JSON() {
		return writeJSON(g.Stdout, runs)
	}
	if len(runs) == 0 {
		fmt.Fprintln(g.Stdout, "no reaper run recorded yet")
		return nil
	}
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTARTED (UTC)\tMODE\tRESULT\tTOOK\tDELETED\tFLAGGED\tHOLDER\tERROR")
	for _, r := range runs {
		took := "-"
		if r.FinishedAt != nil {
			took = r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.StartedAt.UTC().Format(time.RFC3339),
			r.Mode, r.Result, took, r.Deleted, r.Flagged, r.Holder, r.Error)
	}
	return tw.Flush()
}

package ctl

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemd/idemd/internal/operator"
)

// ReaperCmd groups what idemctl tells about the reaper.
type ReaperCmd struct {
	Runs   ReaperRunsCmd   `cmd:"" help:"List the reaper's last runs from its run history (idemd_reaper_runs), whatever mode they ran in: CronJob, --schedule or by hand."`
	Pause  ReaperPauseCmd  `cmd:"" help:"Pause every reaper run before its next batch (a running one and those to come) until reaper resume; recorded as an operator action."`
	Resume ReaperResumeCmd `cmd:"" help:"Lift a reaper pause: runs go on with their next batch; recorded as an operator action."`
}

// ReaperPauseCmd pauses the reaper.
type ReaperPauseCmd struct {
	Operator `embed:""`
}

// Validate reports every problem with the flags (exit 2).
func (c *ReaperPauseCmd) Validate() error { return problems(c.Operator.problems()) }

// Run pauses the reaper. A running run sees the pause before its next
// batch; the batch in progress, if any, commits first.
func (c *ReaperPauseCmd) Run(ctx context.Context, g *Globals) error {
	a := c.actor()
	act, err := operator.PauseReaper(ctx, g.Pool, a, c.Note)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(g.Stdout, "reaper paused by %s at %s (action %d): a running run waits before its next batch, and new runs before their first, until idemctl reaper resume\n",
		a.By, act.At.UTC().Format(time.RFC3339), act.ID)
	return err
}

// ReaperResumeCmd lifts a pause.
type ReaperResumeCmd struct {
	Operator `embed:""`
}

// Validate reports every problem with the flags (exit 2).
func (c *ReaperResumeCmd) Validate() error { return problems(c.Operator.problems()) }

// Run lifts the pause.
func (c *ReaperResumeCmd) Run(ctx context.Context, g *Globals) error {
	a := c.actor()
	act, err := operator.ResumeReaper(ctx, g.Pool, a, c.Note)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(g.Stdout, "reaper resumed by %s at %s (action %d); it was paused by %s at %s: %s\n",
		a.By, act.At.UTC().Format(time.RFC3339), act.ID, act.Was.PausedBy, act.Was.PausedAt.UTC().Format(time.RFC3339), oneLine(act.Was.Note))
	return err
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
	runs, err := operator.ReaperRuns(ctx, g.Pool, c.Last)
	if err != nil {
		return err
	}
	if c.JSON() {
		return writeJSON(g.Stdout, runs)
	}
	paused, err := operator.ReaperPause(ctx, g.Pool)
	if err != nil {
		return err
	}
	if paused != nil {
		fmt.Fprintf(g.Stdout, "PAUSED by %s since %s (action %d): %s; idemctl reaper resume lifts it\n\n",
			paused.PausedBy, paused.PausedAt.UTC().Format(time.RFC3339), paused.ActionID, oneLine(paused.Note))
	}
	if len(runs) == 0 {
		fmt.Fprintln(g.Stdout, "no reaper run recorded yet")
		return nil
	}
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTARTED (UTC)\tMODE\tRESULT\tTOOK\tDELETED\tFLAGGED\tTHROTTLED\tSTOP\tHOLDER\tERROR")
	for _, r := range runs {
		took := "-"
		if r.FinishedAt != nil {
			took = r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.StartedAt.UTC().Format(time.RFC3339),
			r.Mode, r.Result, took, r.Deleted, r.Flagged, operator.Throttled(r), orDash(&r.StopReason), r.Holder, r.Error)
	}
	return tw.Flush()
}

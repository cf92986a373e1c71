package ctl

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/operator"
	"github.com/idemd/idemd/internal/reaper"
)

// OldestSchema is the lowest idemd migration idemctl's commands run on
// (operator.OldestSchema).
const OldestSchema = operator.OldestSchema

// StatusCmd shows what the daemons have left to do.
type StatusCmd struct {
	// The reaper's rules for which keys a run deletes, used only when no
	// reaper run recorded the retention and lock window it runs with
	// (operator.Status): its own flags (reaper.Eligibility, their names,
	// defaults and checks), so that what status counts is what a reaper
	// given the same values deletes.
	reaper.Eligibility `embed:""`
	Output             `embed:""`
}

// flagDefaults are the defaults idemctl's flags take from the services,
// each written once in its service's DefaultSettings: the reaper's
// --retention and --lock-window (status, the console) and the completer's
// --give-up-after (keys retry, the console).
type flagDefaults struct {
	reaper.Eligibility
	GiveUpAfter time.Duration `name:"give-up-after"`
}

// FlagDefaults implements config.Defaulter.
func (c *CLI) FlagDefaults() any {
	return flagDefaults{Eligibility: reaper.DefaultSettings().Eligibility, GiveUpAfter: completer.DefaultSettings().GiveUpAfter}
}

// Validate reports problems with the status flags (exit 2), by the
// reaper's own rules.
func (c *StatusCmd) Validate() error {
	return config.Problems(c.Eligibility.Check())
}

// Status is idemctl status's output, the console's status page's too.
type Status = operator.Overview

// GroupCount is a count and the oldest timestamp of one group.
type GroupCount = operator.GroupCount

// Run gathers and prints the status.
func (c *StatusCmd) Run(ctx context.Context, g *Globals) error {
	st, err := operator.Status(ctx, g.Pool, c.Eligibility)
	if err != nil {
		return err
	}
	if c.JSON() {
		return writeJSON(g.Stdout, st)
	}
	return writeStatus(g, st)
}

func writeStatus(g *Globals, st *Status) error {
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	since := func(t time.Time) string { return operator.Age(st.At.Sub(t)) }
	fmt.Fprintf(tw, "status at %s\n", st.At.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "schema: idemd migration %d (this idemctl runs on %d to %d)\n", st.Schema.Database, st.Schema.BinaryOldest, st.Schema.BinaryNewest)
	if st.Schema.Note != "" {
		fmt.Fprintf(tw, "  note: %s\n", st.Schema.Note)
	}
	fmt.Fprintln(tw)

	fmt.Fprintln(tw, "ENQUEUER\t")
	oldest := "-"
	if st.OldestStagedJobAt != nil {
		oldest = since(*st.OldestStagedJobAt)
	}
	fmt.Fprintf(tw, "  staged jobs (backlog)\t%d\toldest %s\n", st.StagedJobs, oldest)
	fmt.Fprintf(tw, "  dead-lettered staged jobs\t%d\t\n", st.DeadStagedJobs)
	for _, state := range operator.LiveRiverStates {
		if n, ok := st.RiverJobs[state]; ok {
			fmt.Fprintf(tw, "  river jobs %s\t%d\t\n", state, n)
		}
	}

	fmt.Fprintln(tw, "\nCOMPLETER: unfinished keys by recovery point\t")
	if len(st.UnfinishedKeys) == 0 {
		fmt.Fprintln(tw, "  none\t")
	}
	for _, u := range st.UnfinishedKeys {
		fmt.Fprintf(tw, "  %s\t%d\toldest %s\n", u.Name, u.Count, since(u.Oldest))
	}

	if st.SettingsFromRun != nil {
		fmt.Fprintf(tw, "\nREAPER (retention %s, lock window %s, as reaper run %d recorded)\t\n", st.Retention, st.LockWindow, *st.SettingsFromRun)
	} else {
		fmt.Fprintf(tw, "\nREAPER (retention %s, lock window %s)\t\n", st.Retention, st.LockWindow)
		fmt.Fprintf(tw, "  (%s: counted with --retention and --lock-window)\n", st.SettingsNote)
		if g.source("retention") == fromDefault {
			// Counted at the reaper's default, which a reaper configured
			// otherwise does not run with: say so where the count is read.
			fmt.Fprintln(tw, "  (--retention is the reaper's default here; give the reaper's setting, --retention or IDEMD_RETENTION, to count what its runs delete)")
		}
	}
	oldest = "-"
	if st.OldestKeyPastRetention != nil {
		oldest = since(*st.OldestKeyPastRetention)
	}
	fmt.Fprintf(tw, "  keys past retention\t%d\toldest %s\n", st.KeysPastRetention, oldest)
	fmt.Fprintf(tw, "  of them to flag for review\t%d\t\n", st.KeysToFlag)
	last := "none recorded"
	if st.LastReaperSuccess != nil {
		last = since(*st.LastReaperSuccess) + " ago"
	}
	fmt.Fprintf(tw, "  last complete run\t%s\t\n", last)
	if len(st.ReaperRuns) == 0 {
		fmt.Fprintln(tw, "  runs\tnone recorded\t")
	}
	for _, r := range st.ReaperRuns {
		fmt.Fprintf(tw, "  run %d (%s)\t%s\t%s\n", r.ID, r.Mode, r.Result, operator.RunSummary(&r, st.At))
	}

	fmt.Fprintln(tw, "\nOPEN REVIEWS (idemctl review list)\t")
	if len(st.OpenReviews) == 0 {
		fmt.Fprintln(tw, "  none\t")
	}
	for _, r := range st.OpenReviews {
		fmt.Fprintf(tw, "  %s\t%d\toldest %s\n", r.Name, r.Count, since(r.Oldest))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("status: write: %w", err)
	}
	return nil
}

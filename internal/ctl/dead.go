package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/idemd/idemd/internal/operator"
	"github.com/idemd/idemd/internal/riverdb"
)

// DeadCmd groups the dead-letter subcommands.
type DeadCmd struct {
	List    DeadListCmd    `cmd:"" help:"List dead-lettered staged jobs (staged_jobs_dead), oldest first."`
	Show    DeadShowCmd    `cmd:"" help:"Show one dead-lettered staged job, what was done with it and the River job it became."`
	Requeue DeadRequeueCmd `cmd:"" help:"Move dead-lettered staged jobs back into staged_jobs once the cause is fixed (recorded with --by and --note)."`
}

// DeadListCmd lists dead letters.
type DeadListCmd struct {
	Kind   string `name:"kind" help:"Only this job kind (job_name)."`
	Reason string `name:"reason" help:"Only reasons containing this text (e.g. unknown_kind)."`
	Limit  int    `name:"limit" default:"100" help:"At most this many, oldest first."`
	Output `embed:""`
}

// Validate reports problems with the flags (exit 2).
func (c *DeadListCmd) Validate() error {
	if c.Limit < 1 {
		return errors.New("--limit must be at least 1")
	}
	return nil
}

// Run lists the dead letters.
func (c *DeadListCmd) Run(ctx context.Context, g *Globals) error {
	dead, err := operator.ListDead(ctx, g.Pool, operator.DeadFilter{Kind: c.Kind, Reason: c.Reason, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON() {
		return writeJSON(g.Stdout, dead)
	}
	if len(dead) == 0 {
		_, err := fmt.Fprintln(g.Stdout, "no dead-lettered staged jobs match")
		return err
	}
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tDEAD_AT\tAGE\tREASON")
	for _, d := range dead {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Kind, orDash(d.Queue), ts(&d.DeadAt), operator.AgeSeconds(d.AgeSeconds), oneLine(d.Reason))
	}
	return tw.Flush()
}

// DeadShowCmd shows one dead letter.
type DeadShowCmd struct {
	ID     int64 `arg:"" name:"id" help:"The dead letter's id (its staged_jobs id)."`
	Output `embed:""`
}

// Run prints the report.
func (c *DeadShowCmd) Run(ctx context.Context, g *Globals) error {
	rep, err := operator.ShowDead(ctx, g.Pool, c.ID)
	if err != nil {
		return named("dead show", err)
	}
	if c.JSON() {
		return writeJSON(g.Stdout, rep)
	}
	return writeDeadReport(g.Stdout, rep)
}

func writeDeadReport(w io.Writer, rep *operator.DeadReport) error {
	fmt.Fprintf(w, "staged job %d\n\n", rep.ID)
	where := "gone (not dead, not staged, no River job names it)"
	switch {
	case rep.Dead != nil:
		where = "dead-lettered (staged_jobs_dead)"
	case rep.Staged:
		where = "staged again, waiting for the enqueuer (staged_jobs)"
	case len(rep.River) > 0:
		where = "moved into River"
	}
	pairs := [][2]string{{"where", where}}
	if d := rep.Dead; d != nil {
		pairs = append(pairs,
			[2]string{"kind", d.Kind},
			[2]string{"reason", d.Reason},
			[2]string{"args", string(d.Args)},
			[2]string{"queue", orDash(d.Queue)},
			[2]string{"priority", intOrDash(d.Priority)},
			[2]string{"max attempts", intOrDash(d.MaxAttempts)},
			[2]string{"scheduled at", ts(d.ScheduledAt)},
			[2]string{"tags", strings.Join(d.Tags, ",")},
			[2]string{"metadata", string(d.Metadata)},
			[2]string{"staged at", ts(&d.CreatedAt)},
			[2]string{"dead at", ts(&d.DeadAt) + " (" + operator.AgeSeconds(d.AgeSeconds) + " ago)"},
		)
		if rep.OlderDead > 0 {
			pairs = append(pairs, [2]string{"older dead letters", fmt.Sprintf("%d of this id (dead list shows them; requeue takes the newest first)", rep.OlderDead)})
		}
	}
	writeLines(w, pairs)
	if len(rep.River) > 0 {
		fmt.Fprintln(w, "\nRIVER JOBS (metadata "+riverdb.MetadataStagedID+")")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tKIND\tSTATE\tQUEUE\tATTEMPT\tCREATED_AT\tFINALIZED_AT")
		for _, j := range rep.River {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Kind, j.State, orDash(j.Queue), intOrDash(j.Attempt), ts(&j.CreatedAt), ts(j.DoneAt))
		}
		tw.Flush()
	}
	writeActions(w, rep.Actions)
	if rep.Dead != nil {
		_, err := fmt.Fprintf(w, "\nrequeue: idemctl dead requeue %d --by WHO --note WHY\n", rep.ID)
		return err
	}
	return nil
}

func intOrDash(i *int32) string {
	if i == nil {
		return "-"
	}
	return strconv.Itoa(int(*i))
}

// DeadRequeueCmd requeues dead letters.
type DeadRequeueCmd struct {
	IDs      []int64 `arg:"" name:"id" help:"The dead letters' ids."`
	Operator `embed:""`
}

// Validate reports every problem with the arguments (exit 2).
func (c *DeadRequeueCmd) Validate() error {
	p := c.Operator.problems()
	for _, id := range c.IDs {
		if id < 1 {
			p = append(p, "<id> must be positive")
			break
		}
	}
	return problems(p)
}

// Run requeues each id in its own statement; an id that is not dead
// (never was, or already requeued) is reported and the command exits 3
// after trying the others.
func (c *DeadRequeueCmd) Run(ctx context.Context, g *Globals) error {
	c.Operator.announce(g)
	var failed []error
	for _, id := range c.IDs {
		res, err := operator.RequeueDead(ctx, g.Pool, id, c.actor(), c.Note)
		if err != nil {
			failed = append(failed, err)
			continue
		}
		fmt.Fprintf(g.Stdout, "staged job %d requeued into staged_jobs by %s at %s (action %d)\n",
			res.ID, res.By, ts(&res.At), res.ActionID)
	}
	if len(failed) > 0 {
		// Joined, not flattened: exit 3 when every failure was a refusal
		// (daemon.ExitCode), 1 when one may pass on a second run.
		return fmt.Errorf("dead requeue: %w", errors.Join(failed...))
	}
	return nil
}

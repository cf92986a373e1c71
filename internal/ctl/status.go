package ctl

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/console"
	"github.com/idemd/idemd/internal/dbstats"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/runhistory"
)

// OldestSchema is the lowest idemd migration idemctl's commands run on:
// 00017_idemd_operator_actions.sql, where `keys` and `dead` record what an
// operator did (status reads the reaper's run history, 00016). `idemctl
// migrate` needs none: it brings the schema up.
const OldestSchema = 17

// StatusCmd shows what the daemons have left to do.
type StatusCmd struct {
	// The reaper's rules for which keys a run deletes; their defaults are
	// the reaper's (FlagDefaults).
	Retention  time.Duration `name:"retention" default:"${retention}" help:"The reaper's --retention: count the keys a run would delete now."`
	LockWindow time.Duration `name:"lock-window" default:"${lock_window}" help:"The reaper's --lock-window: a key locked more recently is in flight and not counted."`
	Output     `embed:""`
}

// FlagDefaults implements config.Defaulter: status's --retention and
// --lock-window default to the reaper's own.
func (c *CLI) FlagDefaults() any { return reaper.DefaultSettings().Eligibility }

// eligibility is the reaper's rules as given to status.
func (c *StatusCmd) eligibility() reaper.Eligibility {
	return reaper.Eligibility{Retention: c.Retention, LockWindow: c.LockWindow}
}

// Validate reports problems with the status flags (exit 2), by the
// reaper's own rules.
func (c *StatusCmd) Validate() error {
	e := c.eligibility()
	return config.Problems(e.Check())
}

// Status is idemctl status's output; the console decodes the same type.
type Status = console.Overview

// GroupCount is a count and the oldest timestamp of one group.
type GroupCount = console.GroupCount

// Each query is answered from an index or a short queue: the staged
// backlog by enqueuer.Backlog (the enqueuer's own count, the one its
// gauges read; staged_jobs is a short queue), the unfinished keys from
// idemd_unfinished_keys (completer.CountUnfinished, the completer's own
// count of its backlog), keys past retention from
// idempotency_keys_created_at (reaper.PlanRun, which also reads each such
// key's row for the reaper's lock and lease rules), open reviews from
// their partial index.
const (
	statusStagedSQL = `SELECT now(), (SELECT count(*) FROM staged_jobs_dead)`
	// The live states are the ones the database-wide exporter counts
	// (dbstats.States), so status and idemd_river_jobs agree.
	statusRiverSQL = `
SELECT state::text, count(*) FROM river_job
WHERE state = ANY(@states::river_job_state[])
GROUP BY state ORDER BY state`
)

// Run gathers and prints the status.
func (c *StatusCmd) Run(ctx context.Context, g *Globals) error {
	st := Status{Retention: c.Retention.String(), LockWindow: c.LockWindow.String(), RiverJobs: map[string]int64{}, UnfinishedKeys: []GroupCount{}, OpenReviews: []GroupCount{}}
	// A schema older than idemctl needs fails here, naming `idemctl
	// migrate`, rather than on the first table it lacks; a newer one is
	// shown with why it is safe.
	schema, err := migrate.Inspect(ctx, g.Pool, OldestSchema)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if err := schema.Err(); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	st.Schema = console.SchemaVersions{Database: schema.Database, BinaryOldest: schema.Oldest, BinaryNewest: schema.Newest,
		NewerThanBinary: schema.NewerThanBinary(), Note: schema.Note()}
	// One read-only snapshot, so the numbers are of the same moment.
	tx, err := g.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("status: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only

	if err := tx.QueryRow(ctx, statusStagedSQL).Scan(&st.At, &st.DeadStagedJobs); err != nil {
		return fmt.Errorf("status: staged jobs: %w", err)
	}
	backlog, err := enqueuer.Backlog(ctx, tx)
	if err != nil {
		return fmt.Errorf("status: staged jobs: %w", err)
	}
	st.StagedJobs, st.OldestStagedJobAt = backlog.Jobs, backlog.Oldest
	if st.OldestStagedJobAt != nil {
		st.OldestStagedJobAge = st.At.Sub(*st.OldestStagedJobAt).Seconds()
	}
	rows, err := tx.Query(ctx, statusRiverSQL, pgx.NamedArgs{"states": dbstats.States})
	if err != nil {
		return fmt.Errorf("status: river jobs: %w", err)
	}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			rows.Close()
			return fmt.Errorf("status: river jobs: %w", err)
		}
		st.RiverJobs[state] = n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("status: river jobs: %w", err)
	}
	unfinished, err := completer.CountUnfinished(ctx, tx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	for _, u := range unfinished {
		st.UnfinishedKeys = append(st.UnfinishedKeys, GroupCount{Name: u.RecoveryPoint, Count: u.Count, Oldest: u.Oldest})
	}
	plan, err := reaper.PlanRun(ctx, tx, c.eligibility())
	if err != nil {
		return fmt.Errorf("status: keys past retention: %w", err)
	}
	st.KeysPastRetention, st.KeysToFlag, st.OldestKeyPastRetention = plan.Deletes, plan.Flags, plan.Oldest
	if st.ReaperRuns, err = runhistory.LastRuns(ctx, tx, statusReaperRuns); err != nil {
		return fmt.Errorf("status: reaper runs: %w", err)
	}
	if st.LastReaperSuccess, err = runhistory.LastSuccess(ctx, tx); err != nil {
		return fmt.Errorf("status: reaper runs: %w", err)
	}
	reviews, err := review.Open(ctx, tx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	for _, r := range reviews {
		st.OpenReviews = append(st.OpenReviews, GroupCount{Name: r.Reason, Count: r.Count, Oldest: r.Oldest})
	}

	if c.JSON() {
		return writeJSON(g.Stdout, st)
	}
	return writeStatus(g, &st)
}

// statusReaperRuns is how many of the reaper's last runs status shows.
const statusReaperRuns = 5

// runSummary describes a reaper run in one line: when it started, how long
// it took, what it did, and its error.
func runSummary(r *runhistory.Run, since func(time.Time) string) string {
	s := "started " + since(r.StartedAt) + " ago"
	if r.FinishedAt != nil {
		s += ", took " + r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
	}
	s += fmt.Sprintf(", deleted %d, flagged %d", r.Deleted, r.Flagged)
	if r.ThrottledSeconds > 0 {
		s += ", throttled " + throttled(*r)
	}
	if r.StopReason != "" {
		s += ", stopped by " + r.StopReason
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

func writeStatus(g *Globals, st *Status) error {
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	since := func(t time.Time) string { return age(st.At.Sub(t).Seconds()) }
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
	for _, state := range []string{"available", "scheduled", "retryable", "running", "pending"} {
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

	fmt.Fprintf(tw, "\nREAPER (retention %s, lock window %s)\t\n", st.Retention, st.LockWindow)
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
		fmt.Fprintf(tw, "  run %d (%s)\t%s\t%s\n", r.ID, r.Mode, r.Result, runSummary(&r, since))
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

package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/dbstats"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/reaperpause"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/runhistory"
)

// OldestSchema is the lowest idemd migration the operator's reads and
// writes run on: 00017_idemd_operator_actions.sql, where keys and dead
// letters record what an operator did (status reads the reaper's run
// history, 00016). `idemctl migrate` needs none: it brings the schema up.
const OldestSchema = 17

// Overview is what status knows: `idemctl status -o json` prints it and
// the console's status page renders it.
type Overview struct {
	At time.Time `json:"at"`

	// Enqueuer: staged rows not yet moved to River, and dead-lettered ones.
	StagedJobs         int64      `json:"staged_jobs"`
	OldestStagedJobAt  *time.Time `json:"oldest_staged_job_at"`
	OldestStagedJobAge float64    `json:"oldest_staged_job_age_seconds"`
	DeadStagedJobs     int64      `json:"dead_staged_jobs"`
	// River jobs not yet finalized, by state.
	RiverJobs map[string]int64 `json:"river_jobs"`

	// Completer: unfinished keys it may still work on, by recovery point.
	UnfinishedKeys []GroupCount `json:"unfinished_keys"`

	// Reaper: what a run would do now, by the reaper's own rules
	// (reaper.PlanRun): keys past retention that are not in flight nor
	// leased by the completer, and the reviews deleting them would create.
	// Retention and LockWindow are the newest reaper run's, as it recorded
	// them (SettingsFromRun names it); when no run recorded them (a fresh
	// install, or only runs of a release before migration 00031) they are
	// the reader's own, its flags or their defaults, and SettingsNote says
	// so.
	Retention              string     `json:"retention"`
	LockWindow             string     `json:"lock_window"`
	SettingsFromRun        *int64     `json:"settings_from_run"`
	SettingsNote           string     `json:"settings_note,omitempty"`
	KeysPastRetention      int64      `json:"keys_past_retention"`
	KeysToFlag             int64      `json:"keys_to_flag"`
	OldestKeyPastRetention *time.Time `json:"oldest_key_past_retention_at"`
	// The reaper's run history (runhistory.LastRuns), newest first: the runs
	// of the CronJob, manual runs and --schedule reapers alike, a killed
	// run as interrupted. LastReaperSuccess is when the last complete run
	// ended (nil: none in the history).
	ReaperRuns        []runhistory.Run `json:"reaper_runs"`
	LastReaperSuccess *time.Time       `json:"last_reaper_success_at"`

	// Humans: open reviews by reason.
	OpenReviews []GroupCount `json:"open_reviews"`

	// The database's idemd schema against the binary that read it.
	Schema SchemaVersions `json:"schema"`
}

// SchemaVersions is the database's idemd schema version (its highest
// applied migration) and the range the reading binary runs on
// (migrate.Schema).
type SchemaVersions struct {
	Database        int64  `json:"database"`
	BinaryOldest    int64  `json:"binary_oldest"`
	BinaryNewest    int64  `json:"binary_newest"`
	NewerThanBinary bool   `json:"newer_than_binary"`
	Note            string `json:"note,omitempty"`
}

// GroupCount is a count and the oldest timestamp of one group.
type GroupCount struct {
	Name   string    `json:"name"`
	Count  int64     `json:"count"`
	Oldest time.Time `json:"oldest"`
}

// StatusReaperRuns is how many of the reaper's last runs status shows.
const StatusReaperRuns = 5

// statusDeadSQL reads the clock every age is measured on and the dead
// letters' count (staged_jobs_dead is a short list).
const statusDeadSQL = `SELECT now(), (SELECT count(*) FROM staged_jobs_dead)`

// Status gathers the overview in one read-only snapshot, so its numbers
// are of one moment, each from the owner of its rule: the staged backlog
// is enqueuer.Backlog (the count its gauges read), River's live jobs
// dbstats.CountJobs (idemd_river_jobs' query), the unfinished keys
// completer.CountUnfinished, keys past retention reaper.PlanRun under the
// retention and lock window the newest reaper run recorded
// (runhistory.LastSettings), or under fallback when none did, the runs
// runhistory's, open reviews review.Open.
//
// A schema older than OldestSchema fails here, naming `idemctl migrate`,
// rather than on the first table it lacks; a newer one is reported with
// why it is safe.
func Status(ctx context.Context, pool *pgxpool.Pool, fallback reaper.Eligibility) (*Overview, error) {
	st := &Overview{UnfinishedKeys: []GroupCount{}, OpenReviews: []GroupCount{}}
	schema, err := migrate.Inspect(ctx, pool, OldestSchema)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if err := schema.Err(); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	st.Schema = SchemaVersions{Database: schema.Database, BinaryOldest: schema.Oldest, BinaryNewest: schema.Newest,
		NewerThanBinary: schema.NewerThanBinary(), Note: schema.Note()}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("status: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only

	if err := tx.QueryRow(ctx, statusDeadSQL).Scan(&st.At, &st.DeadStagedJobs); err != nil {
		return nil, fmt.Errorf("status: staged jobs: %w", err)
	}
	backlog, err := enqueuer.Backlog(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: staged jobs: %w", err)
	}
	st.StagedJobs, st.OldestStagedJobAt = backlog.Jobs, backlog.Oldest
	if st.OldestStagedJobAt != nil {
		st.OldestStagedJobAge = st.At.Sub(*st.OldestStagedJobAt).Seconds()
	}
	if st.RiverJobs, err = dbstats.CountJobs(ctx, tx); err != nil {
		return nil, fmt.Errorf("status: river jobs: %w", err)
	}
	unfinished, err := completer.CountUnfinished(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	for _, u := range unfinished {
		st.UnfinishedKeys = append(st.UnfinishedKeys, GroupCount{Name: u.RecoveryPoint, Count: u.Count, Oldest: u.Oldest})
	}
	e, err := reaperSettings(ctx, tx, st, fallback)
	if err != nil {
		return nil, err
	}
	plan, err := reaper.PlanRun(ctx, tx, e)
	if err != nil {
		return nil, fmt.Errorf("status: keys past retention: %w", err)
	}
	st.KeysPastRetention, st.KeysToFlag, st.OldestKeyPastRetention = plan.Deletes, plan.Flags, plan.Oldest
	if st.ReaperRuns, err = runhistory.LastRuns(ctx, tx, StatusReaperRuns); err != nil {
		return nil, fmt.Errorf("status: reaper runs: %w", err)
	}
	if st.LastReaperSuccess, err = runhistory.LastSuccess(ctx, tx); err != nil {
		return nil, fmt.Errorf("status: reaper runs: %w", err)
	}
	reviews, err := review.Open(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	for _, r := range reviews {
		st.OpenReviews = append(st.OpenReviews, GroupCount{Name: r.Reason, Count: r.Count, Oldest: r.Oldest})
	}
	return st, nil
}

// NoRecordedSettings is Overview.SettingsNote when no reaper run recorded
// its retention and lock window.
const NoRecordedSettings = "no reaper run recorded its retention and lock window (a fresh install, or runs of a release before migration 00031)"

// reaperSettings picks the retention and lock window status counts keys
// past retention by: the newest recorded run's, which is what the reaper
// deletes by, else fallback, noted in st.
func reaperSettings(ctx context.Context, db runhistory.Querier, st *Overview, fallback reaper.Eligibility) (reaper.Eligibility, error) {
	rec, err := runhistory.LastSettings(ctx, db)
	if err != nil {
		return reaper.Eligibility{}, fmt.Errorf("status: %w", err)
	}
	e := fallback
	if rec != nil {
		e = reaper.Eligibility{Retention: rec.Retention, LockWindow: rec.LockWindow}
		st.SettingsFromRun = &rec.Run
	} else {
		st.SettingsNote = NoRecordedSettings
	}
	st.Retention, st.LockWindow = e.Retention.String(), e.LockWindow.String()
	return e, nil
}

// LiveRiverStates are River's live states in the order status shows them.
var LiveRiverStates = []string{"available", "scheduled", "retryable", "running", "pending"}

// RunSummary describes a reaper run in one line: when it started (its age
// at now), how long it took, what it did, and its error.
func RunSummary(r *runhistory.Run, now time.Time) string {
	s := "started " + Age(now.Sub(r.StartedAt)) + " ago"
	if r.FinishedAt != nil {
		s += ", took " + r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
	}
	s += fmt.Sprintf(", deleted %d, flagged %d", r.Deleted, r.Flagged)
	if r.ThrottledSeconds > 0 {
		s += ", throttled " + Throttled(*r)
	}
	if r.StopReason != "" {
		s += ", stopped by " + r.StopReason
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// Throttled renders a run's throttled time and the reason of its latest
// wait: "12.5s replica_lag", "-" for none.
func Throttled(r runhistory.Run) string {
	if r.ThrottledSeconds <= 0 {
		return "-"
	}
	d := time.Duration(r.ThrottledSeconds * float64(time.Second)).Round(time.Millisecond)
	return d.String() + " " + r.ThrottleReason
}

// ReaperPause is the reaper's pause (nil when not paused), and nil on a
// schema before migration 00030, which has no pause to show.
func ReaperPause(ctx context.Context, db reaperpause.Querier) (*reaperpause.State, error) {
	st, err := reaperpause.Get(ctx, db)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return nil, nil
	}
	return st, err
}

// Package runhistory is the reaper's run history, idemd_reaper_runs
// (migrations/00016): one row per run that is not a dry run, whatever ran
// it (the CronJob, a manual run, a --schedule reaper). It is the one owner
// of the table: the reaper writes its runs through it (Start, RecordBatch,
// End, RecordUnleased), and every reader (idemctl status, the console, the
// database-wide exporter internal/dbstats) reads through LastRuns and
// LastSuccess, so no service imports another for it.
//
// A run that takes the reaper's lease (LeaseName) inserts its row at once,
// adds each batch's counts in the batch's own transaction, and records its
// end in the transaction that releases the lease. A row without an end
// therefore belongs to a run that did not release its lease: running while
// its holder still holds a live lease, interrupted once it does not. A run
// that never held the lease inserts one finished row at its end. Each end
// prunes the table to the newest 1000 runs of the last 30 days.
package runhistory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LeaseName is the row in idemd_leases a reaper run holds while it runs
// (the reaper takes, renews and releases it): the history reads a run
// without an end as running while its holder holds it.
const LeaseName = "reaper"

// Modes of a run, the history's mode column.
const (
	ModeOnce     = "once"     // one run and exit: a CronJob or a manual run
	ModeSchedule = "schedule" // a run of a --schedule reaper
)

// Results a run in the history can have: its outcome (complete,
// incomplete, lock_held, error; the reaper's result label uses the same
// words), or for a run whose end is not recorded, whether it is still
// going.
const (
	ResultComplete   = "complete"   // everything eligible was reaped
	ResultIncomplete = "incomplete" // stopped by --max-runtime or shutdown; the next run continues
	ResultLockHeld   = "lock_held"  // another live run held the lease
	ResultError      = "error"      // failed; the row's error says why
	// ResultRunning: no end yet, and its holder still holds the lease.
	ResultRunning = "running"
	// ResultInterrupted: no end, and its holder no longer holds the lease:
	// the run was killed (or lost the database at its end).
	ResultInterrupted = "interrupted"
)

// The history keeps the newest keep runs of the last maxAge.
const (
	keep   = 1000
	maxAge = 30 * 24 * time.Hour
)

// Run is one run of the history.
type Run struct {
	ID         int64      `json:"id"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Mode       string     `json:"mode"`
	Result     string     `json:"result"`
	// Deleted and Flagged count the run's committed batches, also for a run
	// that was interrupted.
	Deleted int64  `json:"deleted"`
	Flagged int64  `json:"flagged"`
	Error   string `json:"error,omitempty"`
	// Holder is the process that ran it, as in the lease table.
	Holder string `json:"holder"`
	// ThrottledSeconds is the time the run waited between batches for
	// its throttle (internal/reaper/throttle), ThrottleReason the reason of
	// its latest wait ("" when it never waited).
	ThrottledSeconds float64 `json:"throttled_seconds"`
	ThrottleReason   string  `json:"throttle_reason,omitempty"`
	// StopReason is why an incomplete or failed run stopped: max_runtime,
	// shutdown, critical_load, error ("" for the others).
	StopReason string `json:"stop_reason,omitempty"`
}

// Querier runs the history's read queries: a pool, a connection or a
// transaction (idemctl status reads everything in one snapshot).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Execer runs the history's writes: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// lastRunsSQL lists the newest runs. A run without an end is running while
// its holder holds a live lease and has begun no later run; otherwise it
// was interrupted. The throttle's columns (migration 00030) are read
// through to_jsonb, which has no such key on an older schema, so idemctl
// reads a history its oldest supported schema wrote as well.
const lastRunsSQL = `
SELECT r.id, r.started_at, r.finished_at, r.mode,
       COALESCE(r.result, CASE WHEN EXISTS (
                SELECT 1 FROM idemd_leases l
                WHERE l.name = @lease AND l.holder = r.holder AND l.expires_at > clock_timestamp())
            AND NOT EXISTS (SELECT 1 FROM idemd_reaper_runs n WHERE n.holder = r.holder AND n.id > r.id)
            THEN '` + ResultRunning + `' ELSE '` + ResultInterrupted + `' END),
       r.deleted, r.flagged, COALESCE(r.error, ''), r.holder,
       COALESCE((to_jsonb(r)->>'throttled_seconds')::float8, 0),
       COALESCE(to_jsonb(r)->>'throttle_reason', ''),
       COALESCE(to_jsonb(r)->>'stop_reason', '')
FROM idemd_reaper_runs r
ORDER BY r.id DESC
LIMIT @n`

// LastRuns returns the newest n runs of the history, newest first.
func LastRuns(ctx context.Context, db Querier, n int) ([]Run, error) {
	rows, err := db.Query(ctx, lastRunsSQL, pgx.NamedArgs{"lease": LeaseName, "n": n})
	if err != nil {
		return nil, fmt.Errorf("reaper run history: last runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) {
		var run Run
		err := r.Scan(&run.ID, &run.StartedAt, &run.FinishedAt, &run.Mode, &run.Result, &run.Deleted, &run.Flagged, &run.Error, &run.Holder,
			&run.ThrottledSeconds, &run.ThrottleReason, &run.StopReason)
		return run, err
	})
	if err != nil {
		return nil, fmt.Errorf("reaper run history: last runs: %w", err)
	}
	if runs == nil {
		runs = []Run{}
	}
	return runs, nil
}

// LastSuccess returns when the last complete run ended, by the database
// clock, whatever process ran it; nil when the history has none. The
// database-wide exporter (internal/dbstats) exports it, so the health of a
// CronJob reaper, which lives too briefly to be scraped, is visible in a
// long-running daemon's metrics.
func LastSuccess(ctx context.Context, db Querier) (*time.Time, error) {
	var t *time.Time
	err := db.QueryRow(ctx, `SELECT max(finished_at) FROM idemd_reaper_runs WHERE result = @result`,
		pgx.NamedArgs{"result": ResultComplete}).Scan(&t)
	if err != nil {
		return nil, fmt.Errorf("reaper run history: last success: %w", err)
	}
	return t, nil
}

// lastThrottledShareSQL is the share of its time the newest run that took
// the lease spent throttled: its throttled_seconds over its duration so far
// (to its end, or to now while it runs). Through to_jsonb, like
// lastRunsSQL, so it reads an older schema's history as never throttled.
const lastThrottledShareSQL = `
SELECT COALESCE((to_jsonb(r)->>'throttled_seconds')::float8, 0)
       / greatest(extract(epoch FROM COALESCE(r.finished_at, clock_timestamp()) - r.started_at)::float8, 1)
FROM idemd_reaper_runs r
WHERE r.result IS DISTINCT FROM @lock_held
ORDER BY r.id DESC
LIMIT 1`

// LastThrottledShare returns the share (0 to 1) of its time the newest
// run that took the lease spent waiting for its throttle, so far if it
// runs; nil when the history has no such run. The database-wide exporter
// exports it: a CronJob run throttled most of its window is visible
// without scraping it.
func LastThrottledShare(ctx context.Context, db Querier) (*float64, error) {
	var share float64
	err := db.QueryRow(ctx, lastThrottledShareSQL, pgx.NamedArgs{"lock_held": ResultLockHeld}).Scan(&share)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reaper run history: throttled share: %w", err)
	}
	share = min(share, 1)
	return &share, nil
}

// startSQL records a run that took the lease. @elapsed is how long ago it
// started (it may have waited for the lease), so started_at is on the
// database clock like the rest of the row. The retention and lock window it
// runs with (migration 00031) are recorded with it: idemctl status and the
// console count keys past retention by them (LastSettings).
const startSQL = `
INSERT INTO idemd_reaper_runs (started_at, mode, holder, retention, lock_window)
VALUES (clock_timestamp() - @elapsed::interval, @mode, @holder, @retention::interval, @lock_window::interval)
RETURNING id`

// startSQLBefore31 is startSQL on a schema before migration 00031, which
// the reaper still runs on: the run is recorded without its settings, and
// readers fall back to their own.
const startSQLBefore31 = `
INSERT INTO idemd_reaper_runs (started_at, mode, holder)
VALUES (clock_timestamp() - @elapsed::interval, @mode, @holder)
RETURNING id`

// hasSettingsSQL says whether idemd_reaper_runs has migration 00031's
// columns. Asked before the insert rather than trying it, so Start works in
// a caller's transaction too (a failed statement would abort it).
const hasSettingsSQL = `
SELECT count(*) = 2 FROM pg_attribute
WHERE attrelid = to_regclass('idemd_reaper_runs') AND attname IN ('retention', 'lock_window') AND NOT attisdropped`

// Settings are the reaper's settings a run records: what decided which keys
// it deleted. Zero values are recorded as unknown (NULL).
type Settings struct {
	Retention  time.Duration
	LockWindow time.Duration
}

func orNull(d time.Duration) *time.Duration {
	if d <= 0 {
		return nil
	}
	return &d
}

// Start records the start of a run that holds the lease and returns its
// row's id. elapsed is how long ago the run began; holder names its
// process as in the lease table; set is what the run runs with (not
// recorded on a schema before migration 00031).
func Start(ctx context.Context, db Execer, elapsed time.Duration, mode, holder string, set Settings) (int64, error) {
	var has bool
	if err := db.QueryRow(ctx, hasSettingsSQL).Scan(&has); err != nil {
		return 0, fmt.Errorf("record the run's start in idemd_reaper_runs: schema: %w", err)
	}
	stmt := startSQLBefore31
	if has {
		stmt = startSQL
	}
	var id int64
	err := db.QueryRow(ctx, stmt, pgx.NamedArgs{"elapsed": elapsed, "mode": mode, "holder": holder,
		"retention": orNull(set.Retention), "lock_window": orNull(set.LockWindow)}).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record the run's start in idemd_reaper_runs: %w", err)
	}
	return id, nil
}

// Recorded are the settings the newest run that recorded them ran with.
type Recorded struct {
	Settings
	Run       int64     // the run's id
	StartedAt time.Time // when it started
}

// lastSettingsSQL finds the newest run that recorded its settings. Through
// to_jsonb, like lastRunsSQL, so a schema before migration 00031 reads as
// no run having recorded them; the history holds at most 1000 rows. The
// intervals come back as microseconds: a time.Duration, whatever the
// session's IntervalStyle.
const lastSettingsSQL = `
SELECT r.id, r.started_at,
       (extract(epoch FROM (to_jsonb(r)->>'retention')::interval) * 1000000)::bigint,
       (extract(epoch FROM (to_jsonb(r)->>'lock_window')::interval) * 1000000)::bigint
FROM idemd_reaper_runs r
WHERE to_jsonb(r)->>'retention' IS NOT NULL AND to_jsonb(r)->>'lock_window' IS NOT NULL
ORDER BY r.id DESC
LIMIT 1`

// LastSettings returns the retention and lock window of the newest run
// that recorded them (a dry run records nothing); nil when none did: a
// fresh install, or only runs of a release before migration 00031.
func LastSettings(ctx context.Context, db Querier) (*Recorded, error) {
	var rec Recorded
	var retention, lockWindow int64
	err := db.QueryRow(ctx, lastSettingsSQL).Scan(&rec.Run, &rec.StartedAt, &retention, &lockWindow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reaper run history: last settings: %w", err)
	}
	rec.Retention, rec.LockWindow = time.Duration(retention)*time.Microsecond, time.Duration(lockWindow)*time.Microsecond
	return &rec, nil
}

// RecordBatch adds a batch's counts to its run's row, in the batch's
// transaction tx: a run killed later still shows what it committed, and a
// batch rolled back counts nothing.
func RecordBatch(ctx context.Context, tx pgx.Tx, run, deleted, flagged int64) error {
	_, err := tx.Exec(ctx, `UPDATE idemd_reaper_runs SET deleted = deleted + @deleted, flagged = flagged + @flagged WHERE id = @run`,
		pgx.NamedArgs{"run": run, "deleted": deleted, "flagged": flagged})
	if err != nil {
		return fmt.Errorf("record the batch in idemd_reaper_runs: %w", err)
	}
	return nil
}

// RecordThrottle adds a wait of the run's throttle to its row, as the run
// waits, so a running run shows it and a killed one keeps it.
func RecordThrottle(ctx context.Context, db Execer, run int64, waited time.Duration, reason string) error {
	_, err := db.Exec(ctx, `UPDATE idemd_reaper_runs SET throttled_seconds = throttled_seconds + @waited, throttle_reason = @reason WHERE id = @run`,
		pgx.NamedArgs{"run": run, "waited": waited.Seconds(), "reason": reason})
	if err != nil {
		return fmt.Errorf("record the run's throttled time in idemd_reaper_runs: %w", err)
	}
	return nil
}

// Outcome is a run's end as the history records it.
type Outcome struct {
	// Result is ResultComplete, ResultIncomplete, ResultLockHeld or
	// ResultError.
	Result           string
	Deleted, Flagged int64
	// Err is the run's error, recorded as its text; nil for none.
	Err error
	// StopReason is why an incomplete or failed run stopped; "" for none.
	// StopDetail, when set and Err is nil, is recorded as the row's error:
	// the measurement that crossed --critical-load.
	StopReason, StopDetail string
}

func (o Outcome) args() pgx.NamedArgs {
	var msg, stop *string
	switch {
	case o.Err != nil:
		m := o.Err.Error()
		msg = &m
	case o.StopDetail != "":
		msg = &o.StopDetail
	}
	if o.StopReason != "" {
		stop = &o.StopReason
	}
	return pgx.NamedArgs{"result": o.Result, "deleted": o.Deleted, "flagged": o.Flagged, "error": msg, "stop_reason": stop}
}

// endSQL records a run's end.
const endSQL = `
UPDATE idemd_reaper_runs
SET finished_at = clock_timestamp(), result = @result, deleted = @deleted, flagged = @flagged, error = @error,
    stop_reason = @stop_reason
WHERE id = @run`

// pruneSQL keeps the history bounded: the newest @keep runs of the last
// @max_age.
const pruneSQL = `
DELETE FROM idemd_reaper_runs
WHERE started_at < clock_timestamp() - @max_age::interval
   OR id <= (SELECT id FROM idemd_reaper_runs ORDER BY id DESC OFFSET @keep LIMIT 1)`

// End records the end of run (its row from Start) and prunes the history,
// in tx: the reaper's transaction that also releases the lease, so a row
// without an end always belongs to a run that did not release it.
func End(ctx context.Context, tx pgx.Tx, run int64, o Outcome) error {
	args := o.args()
	args["run"] = run
	if _, err := tx.Exec(ctx, endSQL, args); err != nil {
		return fmt.Errorf("record the run's end in idemd_reaper_runs: %w", err)
	}
	if _, err := tx.Exec(ctx, pruneSQL, pgx.NamedArgs{"max_age": maxAge, "keep": keep}); err != nil {
		return fmt.Errorf("prune idemd_reaper_runs: %w", err)
	}
	return nil
}

// RecordUnleased records a run that never held the lease (another run held
// it, or the run failed before it had it) as one finished row. elapsed is
// how long ago the run began.
func RecordUnleased(ctx context.Context, db Execer, elapsed time.Duration, mode, holder string, o Outcome) error {
	args := o.args()
	args["elapsed"], args["mode"], args["holder"] = elapsed, mode, holder
	_, err := db.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder, stop_reason)
VALUES (clock_timestamp() - @elapsed::interval, clock_timestamp(), @mode, @result, @deleted, @flagged, @error, @holder, @stop_reason)`, args)
	if err != nil {
		return fmt.Errorf("record the run in idemd_reaper_runs: %w", err)
	}
	return nil
}

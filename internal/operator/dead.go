package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/riverdb"
)

// DeadJob is one staged_jobs_dead row: a staged job the enqueuer could not
// turn into a valid River job, with the reason. Its ID is the staged_jobs
// id it had, and keeps when requeued. Two dead letters may share one ID
// (migration 00032: a row staged with an explicit id, or staged again under
// the id of a dead letter that was kept); `dead show` and `dead requeue`
// act on the newest.
type DeadJob struct {
	ID          int64           `json:"id"`
	CreatedAt   time.Time       `json:"created_at"`
	Kind        string          `json:"job_name"`
	Args        json.RawMessage `json:"job_args"`
	Queue       *string         `json:"queue"`
	Priority    *int32          `json:"priority"`
	MaxAttempts *int32          `json:"max_attempts"`
	ScheduledAt *time.Time      `json:"scheduled_at"`
	Tags        []string        `json:"tags"`
	Metadata    json.RawMessage `json:"metadata"`
	Reason      string          `json:"reason"`
	DeadAt      time.Time       `json:"dead_at"`
	AgeSeconds  float64         `json:"age_seconds"` // since dead_at
}

// DeadFilter selects dead letters for ListDead.
type DeadFilter struct {
	Kind   string // job_name, exactly
	Reason string // a substring of the reason (its code, "unknown_kind", or any part)
	Limit  int
}

const deadColumns = `id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata,
       reason, dead_at, extract(epoch FROM now() - dead_at)::float8`

func collectDead(rows pgx.Rows) ([]DeadJob, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadJob, error) {
		var d DeadJob
		err := r.Scan(&d.ID, &d.CreatedAt, &d.Kind, &d.Args, &d.Queue, &d.Priority, &d.MaxAttempts, &d.ScheduledAt,
			&d.Tags, &d.Metadata, &d.Reason, &d.DeadAt, &d.AgeSeconds)
		return d, err
	})
	if out == nil {
		out = []DeadJob{}
	}
	return out, err
}

// ListDead lists dead letters, oldest first.
func ListDead(ctx context.Context, db DB, f DeadFilter) ([]DeadJob, error) {
	if f.Limit < 1 {
		return nil, fmt.Errorf("%w: the limit must be at least 1", ErrRefused)
	}
	rows, err := db.Query(ctx, "SELECT "+deadColumns+` FROM staged_jobs_dead
WHERE ($1::text IS NULL OR job_name = $1) AND ($2::text IS NULL OR strpos(reason, $2) > 0)
ORDER BY dead_at, id LIMIT $3`, nullString(f.Kind), nullString(f.Reason), f.Limit)
	if err != nil {
		return nil, fmt.Errorf("dead list: %w", err)
	}
	out, err := collectDead(rows)
	if err != nil {
		return nil, fmt.Errorf("dead list: %w", err)
	}
	return out, nil
}

// DeadReport is what `idemctl dead show` and the console's dead-letter
// page show: the dead letter if it is still there, what operators did with
// this staged id, and where it is now (staged again, or the River jobs it
// became, found by the idemd_staged_id the enqueuer puts in River's
// metadata).
type DeadReport struct {
	ID   int64    `json:"id"`
	Dead *DeadJob `json:"dead"` // the newest dead letter of the id; nil once requeued
	// OlderDead counts the other dead letters of the id, older than Dead:
	// each is requeued in turn once the newer ones are.
	OlderDead int      `json:"older_dead"`
	Staged    bool     `json:"staged"`
	River     []JobRef `json:"river_jobs"`
	Actions   []Action `json:"actions"`
}

// ShowDead reports on staged id id in one read-only snapshot. It is
// ErrNotFound only when the id is neither dead, staged, a River job, nor
// named by an action.
func ShowDead(ctx context.Context, db TxDB, id int64) (*DeadReport, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	rep := &DeadReport{ID: id}
	rows, err := tx.Query(ctx, "SELECT "+deadColumns+" FROM staged_jobs_dead WHERE id = $1 ORDER BY dead_at DESC", id)
	if err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	dead, err := collectDead(rows)
	if err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	if len(dead) > 0 {
		rep.Dead, rep.OlderDead = &dead[0], len(dead)-1
	}
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM staged_jobs WHERE id = $1)", id).Scan(&rep.Staged); err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	filter, _ := json.Marshal(map[string]int64{riverdb.MetadataStagedID: id})
	if rep.River, err = riverJobs(ctx, tx, filter); err != nil {
		return nil, fmt.Errorf("dead show: river jobs: %w", err)
	}
	if rep.Actions, err = listActions(ctx, tx, "staged_job_id", id, 100); err != nil {
		return nil, fmt.Errorf("dead show: %w", err)
	}
	if rep.Dead == nil && !rep.Staged && len(rep.River) == 0 && len(rep.Actions) == 0 {
		return nil, fmt.Errorf("%w: no dead-lettered staged job %d", ErrNotFound, id)
	}
	return rep, nil
}

// RequeueResult is what RequeueDead did.
type RequeueResult struct {
	ID       int64     `json:"id"` // the staged id, the same as the dead letter's
	ActionID int64     `json:"action_id"`
	At       time.Time `json:"at"`
	By       string    `json:"by"`
}

// requeueSQL moves one dead letter back into staged_jobs and records it, in
// one statement: every data-modifying part of a WITH runs, on one snapshot,
// in one transaction. Of two dead letters of one id it moves the newest
// (by dead_at; it reads no column of migration 00032's, so it runs on the
// schema before it too). The row lock its SELECT takes makes two
// concurrent requeues of one id wait for each other, and the second then
// finds the row gone and moves and records nothing. The staged row keeps its id (so River's
// idemd_staged_id and this record name the same number) and is staged anew
// at now(); the insert's trigger wakes the enqueuer, which moves it exactly
// once like any staged row, or dead-letters it again with a fresh reason if
// its cause is not fixed. The dead row as it was is the action's detail.
// $1 id, $2 actor, $3 via, $4 note.
const requeueSQL = `
WITH moved AS (
    DELETE FROM staged_jobs_dead
    WHERE ctid = (SELECT ctid FROM staged_jobs_dead WHERE id = $1 ORDER BY dead_at DESC LIMIT 1 FOR UPDATE)
    RETURNING id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata,
        reason, dead_at, unique_key, unique_states
), staged AS (
    INSERT INTO staged_jobs (id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata,
        unique_key, unique_states)
    SELECT id, now(), job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata,
        unique_key, unique_states FROM moved
    RETURNING id
), recorded AS (
    INSERT INTO idemd_operator_actions (actor, action, via, staged_job_id, note, detail)
    SELECT $2, '` + ActionDeadRequeue + `', $3, m.id, $4, to_jsonb(m) FROM moved m
    RETURNING id, at
)
SELECT (SELECT id FROM staged), r.id, r.at FROM recorded r`

// RequeueDead moves dead letter id back into staged_jobs and records who
// and why. ErrNotFound when there is no such dead letter, which is also
// what a second requeue of the same id gets.
func RequeueDead(ctx context.Context, db DB, id int64, actor Actor, note string) (*RequeueResult, error) {
	if err := checkActor(actor, note); err != nil {
		return nil, err
	}
	res := &RequeueResult{By: strings.TrimSpace(actor.By)}
	err := db.QueryRow(ctx, requeueSQL, id, res.By, actor.Via, note).Scan(&res.ID, &res.ActionID, &res.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: no dead-lettered staged job %d (already requeued? see dead show %d)", ErrNotFound, id, id)
	}
	if err != nil {
		return nil, fmt.Errorf("dead requeue %d: %w", id, err)
	}
	return res, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

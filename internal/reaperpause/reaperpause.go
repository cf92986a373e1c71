// Package reaperpause is an operator's pause of the reaper,
// idemd_reaper_pause (migrations/00030): while its one row exists, every
// reaper run waits before its next batch, whichever process runs it (a
// CronJob, a --schedule Deployment, a run by hand), and a run that starts
// waits before its first. It is the one owner of the table's SQL: the
// operator core (internal/operator, `idemctl reaper pause|resume`) writes
// it through Lock, Set and Clear in the transaction that records the
// action, with its own actor check, audit record and refusals; the reaper
// reads it through Get before every batch.
//
// A pause is a row rather than a signal to a process because the reaper
// may be a CronJob whose process does not exist yet, or several replicas
// of a Deployment: the database is what they all read.
package reaperpause

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// State is the pause in force.
type State struct {
	PausedAt time.Time `json:"paused_at"`
	PausedBy string    `json:"paused_by"`
	Note     string    `json:"note"`
	// ActionID is the pause's record in idemd_operator_actions.
	ActionID int64 `json:"action_id"`
}

// Querier reads the pause: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const stateSQL = `SELECT paused_at, paused_by, note, action_id FROM idemd_reaper_pause`

// Get returns the pause in force, nil when the reaper is not paused.
func Get(ctx context.Context, db Querier) (*State, error) {
	var s State
	err := db.QueryRow(ctx, stateSQL).Scan(&s.PausedAt, &s.PausedBy, &s.Note, &s.ActionID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read idemd_reaper_pause: %w", err)
	}
	return &s, nil
}

// Execer writes the pause: the operator's transaction, or a test's pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// lockSQL serialises pauses and resumes: two operators acting at once get
// one answer each, in order, rather than a unique violation.
const lockSQL = `LOCK TABLE idemd_reaper_pause IN SHARE ROW EXCLUSIVE MODE`

// Lock locks the pause against other pauses and resumes until tx ends, and
// returns the pause in force (nil: none). The lock waits at most 5 s.
func Lock(ctx context.Context, tx pgx.Tx) (*State, error) {
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
		return nil, fmt.Errorf("lock idemd_reaper_pause: %w", err)
	}
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		return nil, fmt.Errorf("lock idemd_reaper_pause: %w", err)
	}
	return Get(ctx, tx)
}

// Set puts the pause st in force.
func Set(ctx context.Context, db Execer, st State) error {
	if _, err := db.Exec(ctx, `INSERT INTO idemd_reaper_pause (paused_at, paused_by, note, action_id) VALUES ($1, $2, $3, $4)`,
		st.PausedAt, st.PausedBy, st.Note, st.ActionID); err != nil {
		return fmt.Errorf("pause the reaper: %w", err)
	}
	return nil
}

// Clear lifts the pause in force.
func Clear(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, `DELETE FROM idemd_reaper_pause`); err != nil {
		return fmt.Errorf("resume the reaper: %w", err)
	}
	return nil
}

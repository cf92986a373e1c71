// Package reaperpause is an operator's pause of the reaper,
// idemd_reaper_pause (migrations/00030): while its one row exists, every
// reaper run waits before its next batch, whichever process runs it (a
// CronJob, a --schedule Deployment, a run by hand), and a run that starts
// waits before its first. It is the one owner of the table: `idemctl
// reaper pause|resume` write it through Pause and Resume, each in the
// transaction that records the action in idemd_operator_actions, and the
// reaper reads it through Get before every batch.
//
// A pause is a row rather than a signal to a process because the reaper
// may be a CronJob whose process does not exist yet, or several replicas
// of a Deployment: the database is what they all read.
package reaperpause

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Actions recorded in idemd_operator_actions.
const (
	ActionPause  = "reaper_pause"
	ActionResume = "reaper_resume"
)

// ErrRefused: pausing a paused reaper or resuming one that is not paused.
var ErrRefused = errors.New("refused")

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

// Beginner runs an action's transaction: a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
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

// Action is an operator's pause or resume as recorded.
type Action struct {
	ID int64     `json:"action_id"`
	At time.Time `json:"at"`
	// Was is the pause in force before the action (nil: none).
	Was *State `json:"was"`
}

func check(by, via, note string) error {
	var p []string
	if strings.TrimSpace(by) == "" {
		p = append(p, "an operator identity is required (--by or IDEMD_OPERATOR)")
	}
	if strings.TrimSpace(note) == "" {
		p = append(p, "a note is required: say why")
	}
	if strings.TrimSpace(via) == "" {
		p = append(p, "the channel (via) is required")
	}
	if len(p) > 0 {
		return fmt.Errorf("%w: %s", ErrRefused, strings.Join(p, "; "))
	}
	return nil
}

// lockSQL serialises pauses and resumes: two operators acting at once get
// one answer each, in order, rather than a unique violation.
const lockSQL = `LOCK TABLE idemd_reaper_pause IN SHARE ROW EXCLUSIVE MODE`

const recordSQL = `
INSERT INTO idemd_operator_actions (actor, action, via, note, detail)
VALUES ($1, $2, $3, $4, $5) RETURNING id, at`

// Pause pauses every reaper run and records who did it and why. It refuses
// (ErrRefused) a reaper already paused, naming who paused it.
func Pause(ctx context.Context, db Beginner, by, via, note string) (*Action, error) {
	if err := check(by, via, note); err != nil {
		return nil, err
	}
	a := &Action{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		was, err := lockedState(ctx, tx)
		if err != nil {
			return err
		}
		if was != nil {
			return fmt.Errorf("%w: the reaper is already paused, by %s at %s: %s", ErrRefused, was.PausedBy, was.PausedAt.UTC().Format(time.RFC3339), was.Note)
		}
		if err := tx.QueryRow(ctx, recordSQL, strings.TrimSpace(by), ActionPause, via, note, []byte("{}")).Scan(&a.ID, &a.At); err != nil {
			return fmt.Errorf("record the pause: %w", err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO idemd_reaper_pause (paused_at, paused_by, note, action_id) VALUES ($1, $2, $3, $4)`,
			a.At, strings.TrimSpace(by), note, a.ID)
		if err != nil {
			return fmt.Errorf("pause: %w", err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return nil, err
		}
		return nil, fmt.Errorf("reaper pause: %w", err)
	}
	return a, nil
}

// Resume lifts the pause and records who did it and why, with the pause it
// lifted. It refuses (ErrRefused) a reaper that is not paused.
func Resume(ctx context.Context, db Beginner, by, via, note string) (*Action, error) {
	if err := check(by, via, note); err != nil {
		return nil, err
	}
	a := &Action{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		was, err := lockedState(ctx, tx)
		if err != nil {
			return err
		}
		if was == nil {
			return fmt.Errorf("%w: the reaper is not paused", ErrRefused)
		}
		a.Was = was
		detail, err := json.Marshal(was)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, recordSQL, strings.TrimSpace(by), ActionResume, via, note, detail).Scan(&a.ID, &a.At); err != nil {
			return fmt.Errorf("record the resume: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM idemd_reaper_pause`); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return nil, err
		}
		return nil, fmt.Errorf("reaper resume: %w", err)
	}
	return a, nil
}

func lockedState(ctx context.Context, tx pgx.Tx) (*State, error) {
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		return nil, fmt.Errorf("lock idemd_reaper_pause: %w", err)
	}
	return Get(ctx, tx)
}

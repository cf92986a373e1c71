package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/reaperpause"
	"github.com/idemd/idemd/internal/runhistory"
)

// ReaperAction is an operator's pause or resume of the reaper as recorded.
type ReaperAction struct {
	ID int64     `json:"action_id"`
	At time.Time `json:"at"`
	// Was is the pause in force before the action (nil: none).
	Was *reaperpause.State `json:"was"`
}

// recordSQL records an action that names no key, review or dead letter.
const recordSQL = `
INSERT INTO idemd_operator_actions (actor, action, via, note, detail)
VALUES ($1, $2, $3, $4, $5) RETURNING id, at`

// record writes one action of a in tx and returns its id and time.
func record(ctx context.Context, tx pgx.Tx, a Actor, action, note string, detail []byte) (id int64, at time.Time, err error) {
	if err := tx.QueryRow(ctx, recordSQL, strings.TrimSpace(a.By), action, a.Via, note, detail).Scan(&id, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("record the action: %w", err)
	}
	return id, at, nil
}

// PauseReaper pauses every reaper run (before its next batch, or its first)
// and records who did it and why, in one transaction. It refuses
// (ErrRefused, exit 3) a reaper already paused, naming who paused it.
func PauseReaper(ctx context.Context, db TxDB, a Actor, note string) (*ReaperAction, error) {
	if err := checkActor(a, note); err != nil {
		return nil, err
	}
	res := &ReaperAction{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		was, err := reaperpause.Lock(ctx, tx)
		if err != nil {
			return err
		}
		if was != nil {
			return fmt.Errorf("%w: the reaper is already paused, by %s at %s: %s", ErrRefused, was.PausedBy, was.PausedAt.UTC().Format(time.RFC3339), was.Note)
		}
		if res.ID, res.At, err = record(ctx, tx, a, ActionReaperPause, note, []byte("{}")); err != nil {
			return err
		}
		return reaperpause.Set(ctx, tx, reaperpause.State{PausedAt: res.At, PausedBy: strings.TrimSpace(a.By), Note: note, ActionID: res.ID})
	})
	if err != nil {
		return nil, fmt.Errorf("reaper pause: %w", err)
	}
	return res, nil
}

// ResumeReaper lifts the pause and records who did it and why, with the
// pause it lifted. It refuses (ErrRefused, exit 3) a reaper that is not
// paused.
func ResumeReaper(ctx context.Context, db TxDB, a Actor, note string) (*ReaperAction, error) {
	if err := checkActor(a, note); err != nil {
		return nil, err
	}
	res := &ReaperAction{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		was, err := reaperpause.Lock(ctx, tx)
		if err != nil {
			return err
		}
		if was == nil {
			return fmt.Errorf("%w: the reaper is not paused", ErrRefused)
		}
		res.Was = was
		detail, err := json.Marshal(was)
		if err != nil {
			return err
		}
		if res.ID, res.At, err = record(ctx, tx, a, ActionReaperResume, note, detail); err != nil {
			return err
		}
		return reaperpause.Clear(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("reaper resume: %w", err)
	}
	return res, nil
}

// ReaperRuns returns the reaper's newest n runs, newest first (never nil).
func ReaperRuns(ctx context.Context, db DB, n int) ([]runhistory.Run, error) {
	runs, err := runhistory.LastRuns(ctx, db, n)
	if err != nil {
		return nil, fmt.Errorf("reaper runs: %w", err)
	}
	if runs == nil {
		runs = []runhistory.Run{}
	}
	return runs, nil
}

package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Action is one idemd_operator_actions row: who did what, when and why.
type Action struct {
	ID          int64           `json:"id"`
	At          time.Time       `json:"at"`
	Actor       string          `json:"actor"`
	Action      string          `json:"action"`
	Via         string          `json:"via"`
	KeyID       *int64          `json:"key_id"`
	ReviewID    *int64          `json:"review_id"`
	StagedJobID *int64          `json:"staged_job_id"`
	Note        string          `json:"note"`
	Detail      json.RawMessage `json:"detail"`
}

const actionColumns = `id, at, actor, action, via, key_id, review_id, staged_job_id, note, detail`

// listActions returns the newest actions whose column (key_id or
// staged_job_id, each indexed) is id, newest first.
func listActions(ctx context.Context, db DB, column string, id int64, limit int) ([]Action, error) {
	if id == 0 {
		return []Action{}, nil
	}
	if column != "key_id" && column != "staged_job_id" {
		return nil, fmt.Errorf("actions: unknown column %q", column)
	}
	rows, err := db.Query(ctx, "SELECT "+actionColumns+" FROM idemd_operator_actions WHERE "+column+" = $1 ORDER BY at DESC, id DESC LIMIT $2", id, limit)
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	return collectActions(rows)
}

// RecentActions returns the newest limit actions of any kind, newest first.
func RecentActions(ctx context.Context, db DB, limit int) ([]Action, error) {
	rows, err := db.Query(ctx, "SELECT "+actionColumns+" FROM idemd_operator_actions ORDER BY at DESC, id DESC LIMIT $1", limit)
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	return collectActions(rows)
}

func collectActions(rows pgx.Rows) ([]Action, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Action, error) {
		var a Action
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Action, &a.Via, &a.KeyID, &a.ReviewID, &a.StagedJobID, &a.Note, &a.Detail)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	if out == nil {
		out = []Action{}
	}
	return out, nil
}

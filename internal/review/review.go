// Package review records idempotency keys that need a human: a full snapshot
// of the key row, a reason, and who flagged it. Flagging is idempotent: one
// open review per key and reason (a partial unique index), so retries and
// replicas never pile up duplicates.
package review

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Reasons a key is flagged.
const (
	// ReasonUnfinishedAtRetention: the reaper found the key unfinished at the
	// retention horizon and deleted it.
	ReasonUnfinishedAtRetention = "unfinished_at_retention"
	// ReasonCompleterGaveUp: the completer exhausted its attempts or passed
	// its horizon without the API finishing the request.
	ReasonCompleterGaveUp = "completer_gave_up"
)

// Reasons returns every reason above, for metrics that create a series per
// reason up front (a counter born at 1 shows Prometheus no increase).
func Reasons() []string {
	return []string{ReasonUnfinishedAtRetention, ReasonCompleterGaveUp}
}

// DBTX is satisfied by pgx.Tx, *pgx.Conn and *pgxpool.Pool.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// FlagSQL copies a key row into idempotency_key_reviews. Parameters: $1 key
// id, $2 reason, $3 detail, $4 flagged_by. It is exported so a caller can
// embed it in a larger statement (the reaper flags and deletes in one).
const FlagSQL = `
INSERT INTO idempotency_key_reviews (key_id, user_id, idempotency_key, reason, detail, snapshot, flagged_by)
SELECT k.id, k.user_id, k.idempotency_key, $2, $3, to_jsonb(k), $4
FROM idempotency_keys k
WHERE k.id = $1
ON CONFLICT (key_id, reason) WHERE resolved_at IS NULL DO NOTHING`

// Flag records key keyID for review. It reports whether a new review was
// created (false when the key does not exist or is already flagged for the
// same reason and still open). Run it in the transaction that changes the
// key's state so the flag and the change commit together.
func Flag(ctx context.Context, db DBTX, keyID int64, reason, detail, flaggedBy string) (bool, error) {
	tag, err := db.Exec(ctx, FlagSQL, keyID, reason, detail, flaggedBy)
	if err != nil {
		return false, fmt.Errorf("review flag: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

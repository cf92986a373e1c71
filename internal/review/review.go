// Package review records idempotency keys that need a human: a full snapshot
// of the key row, a reason, and who flagged it. Flagging is idempotent: one
// open review per key and reason (a partial unique index), so retries and
// replicas never pile up duplicates.
package review

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// FlagRowsSQL returns the statement that records a review for every row
// of rows: a relation in scope of the statement it ends (a CTE's name) with
// the columns key_id, snapshot (the whole key row, to_jsonb(k)), reason,
// detail and flagged_by. It is the one definition of a review INSERT,
// composable so a caller can flag keys inside a larger statement (the
// reaper flags in the statement that deletes them, from the statement's
// snapshot of the rows it deleted). A key that already has an open review
// for the same reason is skipped, so retries and replicas never pile up
// duplicates. It returns the key_id and reason of each review created.
func FlagRowsSQL(rows string) string {
	return `
INSERT INTO idempotency_key_reviews (key_id, user_id, idempotency_key, reason, detail, snapshot, flagged_by)
SELECT f.key_id, (f.snapshot->>'user_id')::bigint, f.snapshot->>'idempotency_key', f.reason, f.detail, f.snapshot, f.flagged_by
FROM ` + rows + ` f
ON CONFLICT (key_id, reason) WHERE resolved_at IS NULL DO NOTHING
RETURNING key_id, reason`
}

// flagSQL flags one key. Parameters: @key_id, @reason, @detail,
// @flagged_by.
var flagSQL = `
WITH flag AS (
    SELECT k.id AS key_id, to_jsonb(k) AS snapshot, @reason::text AS reason, @detail::text AS detail, @flagged_by::text AS flagged_by
    FROM idempotency_keys k
    WHERE k.id = @key_id
)` + FlagRowsSQL("flag")

// Flag records key keyID for review. It reports whether a new review was
// created (false when the key does not exist or is already flagged for the
// same reason and still open). Run it in the transaction that changes the
// key's state so the flag and the change commit together.
func Flag(ctx context.Context, db DBTX, keyID int64, reason, detail, flaggedBy string) (bool, error) {
	tag, err := db.Exec(ctx, flagSQL, pgx.NamedArgs{"key_id": keyID, "reason": reason, "detail": detail, "flagged_by": flaggedBy})
	if err != nil {
		return false, fmt.Errorf("review flag: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// OpenGroup is the unresolved reviews of one reason.
type OpenGroup struct {
	Reason string
	Count  int64
	Oldest time.Time     // flagged_at of the oldest
	Age    time.Duration // how old the oldest is, by the database clock
}

// openSQL is served by the partial index of open reviews.
const openSQL = `
SELECT reason, count(*), min(flagged_at), EXTRACT(EPOCH FROM now() - min(flagged_at))::float8
FROM idempotency_key_reviews
WHERE resolved_at IS NULL
GROUP BY reason
ORDER BY reason`

// Open counts the unresolved reviews by reason, the one definition the
// completer's gauges and idemctl status both show.
func Open(ctx context.Context, db Querier) ([]OpenGroup, error) {
	rows, err := db.Query(ctx, openSQL)
	if err != nil {
		return nil, fmt.Errorf("review: open reviews: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenGroup, error) {
		var g OpenGroup
		var age float64
		err := r.Scan(&g.Reason, &g.Count, &g.Oldest, &age)
		g.Age = time.Duration(age * float64(time.Second))
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("review: open reviews: %w", err)
	}
	return out, nil
}

// resolveSQL is the one definition of a resolution: it marks the open
// reviews that cond selects (a condition on @id, @key_id, @reason) resolved
// by @by with @note at the database's now(), and never touches a resolved
// one, so a note is never overwritten.
func resolveSQL(cond string) string {
	return `
UPDATE idempotency_key_reviews
SET resolved_at = now(), resolved_by = @by, resolution_note = @note
WHERE resolved_at IS NULL AND ` + cond + `
RETURNING id, resolved_at`
}

var (
	resolveOneSQL    = resolveSQL("id = @id")
	resolveReasonSQL = resolveSQL("key_id = @key_id AND reason = @reason")
)

// ErrNoReview: no review has the id.
var ErrNoReview = errors.New("no such review")

// AlreadyResolvedError: the review was resolved before, by By at At.
type AlreadyResolvedError struct {
	ID int64
	By string
	At time.Time
}

func (e *AlreadyResolvedError) Error() string {
	return fmt.Sprintf("review %d was already resolved by %s at %s", e.ID, e.By, e.At.UTC().Format(time.RFC3339))
}

// Resolve marks review id resolved by by with note and returns when. A
// review that does not exist is ErrNoReview; one already resolved is an
// *AlreadyResolvedError naming who resolved it.
func Resolve(ctx context.Context, db DBTX, id int64, by, note string) (time.Time, error) {
	var got int64
	var at time.Time
	err := db.QueryRow(ctx, resolveOneSQL, pgx.NamedArgs{"id": id, "by": by, "note": note}).Scan(&got, &at)
	if err == nil {
		return at, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("review resolve: %w", err)
	}
	var prevAt *time.Time
	var prevBy *string
	err = db.QueryRow(ctx, "SELECT resolved_at, resolved_by FROM idempotency_key_reviews WHERE id = $1", id).Scan(&prevAt, &prevBy)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, fmt.Errorf("review resolve: %w %d", ErrNoReview, id)
	case err != nil:
		return time.Time{}, fmt.Errorf("review resolve: %w", err)
	case prevAt == nil:
		// Resolved and reopened between the two statements cannot happen
		// (a resolution is final); say what was seen rather than guess.
		return time.Time{}, fmt.Errorf("review resolve: review %d is open but was not resolved", id)
	}
	by = ""
	if prevBy != nil {
		by = *prevBy
	}
	return time.Time{}, &AlreadyResolvedError{ID: id, By: by, At: *prevAt}
}

// ResolveReason resolves keyID's open review of reason, if it has one, and
// returns the ids resolved ([] for none). Run it in the transaction that
// acts on the key, so the action and the resolution commit together.
func ResolveReason(ctx context.Context, db Querier, keyID int64, reason, by, note string) ([]int64, error) {
	rows, err := db.Query(ctx, resolveReasonSQL, pgx.NamedArgs{"key_id": keyID, "reason": reason, "by": by, "note": note})
	if err != nil {
		return nil, fmt.Errorf("review resolve: %w", err)
	}
	ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int64, error) {
		var id int64
		var at time.Time
		return id, r.Scan(&id, &at)
	})
	if err != nil {
		return nil, fmt.Errorf("review resolve: %w", err)
	}
	if ids == nil {
		ids = []int64{}
	}
	return ids, nil
}

package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/review"
)

// ReviewFilter selects reviews; a zero field does not filter.
type ReviewFilter struct {
	Reason    string
	OlderThan time.Duration // flagged longer ago than this
	NewerThan time.Duration // flagged more recently than this
	State     string        // open (the default), resolved or all
	Limit     int           // at most this many, oldest first; required
}

// listReviewsSQL is parameterised on every filter; NULL disables one.
const listReviewsSQL = `
SELECT ` + ReviewColumns + `
FROM idempotency_key_reviews
WHERE ($1::text IS NULL OR reason = $1)
  AND ($2::bigint IS NULL OR flagged_at < now() - $2::bigint * interval '1 microsecond')
  AND ($3::bigint IS NULL OR flagged_at >= now() - $3::bigint * interval '1 microsecond')
  AND CASE $4::text WHEN 'open' THEN resolved_at IS NULL
                    WHEN 'resolved' THEN resolved_at IS NOT NULL
                    ELSE true END
ORDER BY flagged_at, id
LIMIT $5`

// ListReviews lists the reviews f selects, oldest first; none is [].
func ListReviews(ctx context.Context, db DB, f ReviewFilter) ([]Review, error) {
	state := f.State
	if state == "" {
		state = "open"
	}
	rows, err := db.Query(ctx, listReviewsSQL, nullString(f.Reason), nullMicros(f.OlderThan), nullMicros(f.NewerThan), state, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("review list: %w", err)
	}
	reviews, err := ScanReviews(rows)
	if err != nil {
		return nil, fmt.Errorf("review list: %w", err)
	}
	return reviews, nil
}

func nullMicros(d time.Duration) *int64 {
	if d == 0 {
		return nil
	}
	us := d.Microseconds()
	return &us
}

// Resolution is what ResolveReview did.
type Resolution struct {
	ID int64     `json:"id"`
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// ResolveReview resolves review id as actor with note (review.Resolve). A
// missing review is ErrNotFound; one already resolved is ErrRefused, naming
// who resolved it: a note is never overwritten.
func ResolveReview(ctx context.Context, db DB, id int64, actor Actor, note string) (*Resolution, error) {
	if err := checkActor(actor, note); err != nil {
		return nil, err
	}
	by := strings.TrimSpace(actor.By)
	at, err := review.Resolve(ctx, db, id, by, note)
	var already *review.AlreadyResolvedError
	switch {
	case errors.Is(err, review.ErrNoReview):
		return nil, fmt.Errorf("%w: no review %d", ErrNotFound, id)
	case errors.As(err, &already):
		return nil, fmt.Errorf("%w: %s", ErrRefused, already.Error())
	case err != nil:
		return nil, err
	}
	return &Resolution{ID: id, By: by, At: at}, nil
}

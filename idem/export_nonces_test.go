package idem

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewReplayNoncesWithClock is NewReplayNonces with now as the clock that
// schedules cleanups: for idem's own tests only (the option is not part of
// ReplayNoncesOptions, which an API sees).
func NewReplayNoncesWithClock(pool *pgxpool.Pool, opts ReplayNoncesOptions, now func() time.Time) *ReplayNonces {
	n := NewReplayNonces(pool, opts)
	n.now = now
	return n
}

package soak

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// snapshotWatch reads pg_stat_activity every interval for idemd's sessions
// (application_name idemd-*) that hold a backend_xmin, and keeps how long
// each session held the same one: from the first reading that saw it to
// the last (a lower bound, short of the truth by up to an interval at each
// end). A session that holds one longer than the bound is a violation: a
// snapshot that pins the database's vacuum horizon.
type snapshotWatch struct {
	bound time.Duration

	mu       sync.Mutex
	held     map[heldKey]*heldSnapshot
	longest  heldSnapshot
	over     []SnapshotViolation
	readings int
	errs     int
	lastErr  error

	stop chan struct{}
	done chan struct{}
}

type heldKey struct {
	pid  int
	xmin string
}

// heldSnapshot is one session's one backend_xmin as the readings saw it.
type heldSnapshot struct {
	App         string
	State       string
	Query       string
	First, Last time.Time
}

func (h heldSnapshot) For() time.Duration { return h.Last.Sub(h.First) }

// SnapshotViolation is an idemd session that held a snapshot longer than
// the bound.
type SnapshotViolation struct {
	App, State, Query string
	HeldFor           time.Duration
	At                time.Time // when it was first seen
}

func (v SnapshotViolation) String() string {
	return fmt.Sprintf("%s held a backend_xmin for at least %s from %s (%s: %s)", v.App, v.HeldFor.Round(100*time.Millisecond), v.At.Format("15:04:05"), v.State, v.Query)
}

// SnapshotReport is what the watch saw.
type SnapshotReport struct {
	Bound      time.Duration
	Readings   int
	Errors     int
	LastError  error
	Longest    SnapshotViolation // the longest hold, violation or not
	Violations []SnapshotViolation
}

const snapshotSQL = `
SELECT pid, application_name, backend_xmin::text, coalesce(state, ''), left(query, 160)
FROM pg_stat_activity
WHERE application_name LIKE 'idemd-%' AND backend_xmin IS NOT NULL`

func watchSnapshots(ctx context.Context, admin *pgxpool.Pool, every, bound time.Duration) *snapshotWatch {
	w := &snapshotWatch{bound: bound, held: map[heldKey]*heldSnapshot{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			w.read(ctx, admin, every)
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *snapshotWatch) read(ctx context.Context, admin *pgxpool.Pool, every time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, every+5*time.Second)
	defer cancel()
	now := time.Now()
	rows, err := admin.Query(rctx, snapshotSQL)
	seen := map[heldKey]bool{}
	if err == nil {
		for rows.Next() {
			var k heldKey
			var h heldSnapshot
			if err = rows.Scan(&k.pid, &h.App, &k.xmin, &h.State, &h.Query); err != nil {
				break
			}
			seen[k] = true
			w.mu.Lock()
			if cur, ok := w.held[k]; ok {
				cur.Last, cur.State, cur.Query = now, h.State, h.Query
			} else {
				h.First, h.Last = now, now
				w.held[k] = &h
			}
			w.mu.Unlock()
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readings++
	if err != nil {
		w.errs++
		w.lastErr = err
		return
	}
	for k, h := range w.held {
		if h.For() > w.longest.For() {
			w.longest = *h
		}
		if !seen[k] {
			// Released: a new xmin of this pid is a new hold.
			if h.For() > w.bound {
				w.over = append(w.over, violation(*h))
			}
			delete(w.held, k)
		}
	}
}

// Stop ends the watch and returns what it saw.
func (w *snapshotWatch) Stop() SnapshotReport {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	rep := SnapshotReport{Bound: w.bound, Readings: w.readings, Errors: w.errs, LastError: w.lastErr, Longest: violation(w.longest), Violations: w.over}
	for _, h := range w.held {
		if h.For() > w.bound {
			rep.Violations = append(rep.Violations, violation(*h))
		}
	}
	return rep
}

func violation(h heldSnapshot) SnapshotViolation {
	return SnapshotViolation{App: h.App, State: h.State, Query: h.Query, HeldFor: h.For(), At: h.First}
}

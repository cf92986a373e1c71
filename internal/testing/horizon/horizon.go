// Package horizon watches the database's xmin horizon while a test runs: a
// Sampler reads pg_stat_activity at a short interval and records every
// session of idemd (by application_name, or by role) that holds a
// snapshot longer than a bound. A snapshot held open keeps vacuum from
// removing any row deleted after it, in every table of the database, the
// API's own too; so no idemd session may hold one longer than its longest
// statement (docs/design.md, invariant 7). The end-to-end suite and the
// soak run a Sampler through every scenario and fail on a violation.
//
// How long a session has held its snapshot is read from the server's own
// clock: a session running a statement (state active) has held the
// statement's snapshot since the statement started (query_start, the
// read-committed case, which is all idemd runs); a session idle in a
// transaction that still shows a backend_xmin holds a snapshot of the
// transaction's (an open cursor, a repeatable-read transaction) since its
// start at the latest (xact_start).
package horizon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultBound is the longest a session of idemd may hold a snapshot: the
// longest statement the daemons' defaults allow, the reaper's batch
// (--statement-timeout 15s). Every other statement of theirs is a
// round trip of milliseconds.
const DefaultBound = 15 * time.Second

// Options configure a Sampler. Zero values take the defaults.
type Options struct {
	// Interval between samples (default 250ms).
	Interval time.Duration
	// Bound is the longest an idemd session may hold a snapshot (default
	// DefaultBound).
	Bound time.Duration
	// ApplicationPrefix marks idemd's sessions by application_name
	// (default "idemd-").
	ApplicationPrefix string
	// Roles also mark idemd's sessions: through PgBouncer a session's
	// application_name is the pool's, not the client's.
	Roles []string
	// Ours, when set, decides instead of ApplicationPrefix and Roles which
	// sessions are held to the bound (a suite that runs an earlier
	// release beside this one holds only this one's).
	Ours func(applicationName, role string) bool
	// Logf, when set, is told each violation the first time it is seen.
	Logf func(format string, args ...any)
}

// Violation is one idemd session seen holding a snapshot longer than the
// bound (once per session and transaction, with the longest hold seen).
type Violation struct {
	PID             int
	ApplicationName string
	Role            string
	State           string
	WaitEvent       string
	Query           string
	XactStart       time.Time
	Held            time.Duration
	XminAge         int64 // transactions
}

func (v Violation) String() string {
	return fmt.Sprintf("pid %d (%s, role %s) held a snapshot %s (xmin age %d transactions), %s, waiting on %q: %s",
		v.PID, v.ApplicationName, v.Role, v.Held.Round(time.Millisecond), v.XminAge, v.State, v.WaitEvent, v.Query)
}

// Report is what a Sampler saw.
type Report struct {
	Samples int
	// Errors counts samples that failed (the database was down, for one);
	// LastError is the latest.
	Errors    int
	LastError error
	// Violations, in the order they were first seen.
	Violations []Violation
	// LongestIdemd is the longest any idemd session held a snapshot,
	// within the bound or not, and its application_name.
	LongestIdemd       time.Duration
	LongestIdemdHolder string
	// LongestOther is the longest any other session held a snapshot (the
	// API's, a test's own, an earlier release's daemon), and its
	// application_name.
	LongestOther       time.Duration
	LongestOtherHolder string
	// MaxHorizonAge is the oldest backend_xmin of the database seen at any
	// sample, of any session (the API's, an operator's), in transactions,
	// and its holder's application_name.
	MaxHorizonAge       int64
	MaxHorizonAgeHolder string
}

// Err is nil when no idemd session held a snapshot longer than the bound
// and at least one sample was read.
func (r Report) Err() error {
	if r.Samples == 0 {
		return fmt.Errorf("horizon: no sample was read (%d failed, last: %v)", r.Errors, r.LastError)
	}
	if len(r.Violations) == 0 {
		return nil
	}
	lines := make([]string, len(r.Violations))
	for i, v := range r.Violations {
		lines[i] = v.String()
	}
	return fmt.Errorf("horizon: %d idemd session(s) held a snapshot longer than the bound:\n  %s", len(r.Violations), strings.Join(lines, "\n  "))
}

func (r Report) String() string {
	return fmt.Sprintf("%d samples (%d failed): %d violations; longest idemd snapshot %s (%s), longest other %s (%s); oldest xmin of the database %d transactions (%s)",
		r.Samples, r.Errors, len(r.Violations), r.LongestIdemd.Round(time.Millisecond), r.LongestIdemdHolder,
		r.LongestOther.Round(time.Millisecond), r.LongestOtherHolder, r.MaxHorizonAge, r.MaxHorizonAgeHolder)
}

// Sampler samples until Stop.
type Sampler struct {
	opts   Options
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	rep  Report
	seen map[sessionTxn]int // index into rep.Violations
}

type sessionTxn struct {
	pid   int
	start time.Time
}

// Start samples pool's database every opts.Interval until Stop.
func Start(ctx context.Context, pool *pgxpool.Pool, opts Options) *Sampler {
	if opts.Interval <= 0 {
		opts.Interval = 250 * time.Millisecond
	}
	if opts.Bound <= 0 {
		opts.Bound = DefaultBound
	}
	if opts.ApplicationPrefix == "" {
		opts.ApplicationPrefix = "idemd-"
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Sampler{opts: opts, pool: pool, cancel: cancel, done: make(chan struct{}), seen: map[sessionTxn]int{}}
	go s.run(ctx)
	return s
}

// Stop ends the sampling and returns what it saw.
func (s *Sampler) Stop() Report {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.rep
	rep.Violations = slices.Clone(rep.Violations)
	return rep
}

// Snapshot returns what the sampler saw so far, and keeps sampling.
func (s *Sampler) Snapshot() Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.rep
	rep.Violations = slices.Clone(rep.Violations)
	return rep
}

func (s *Sampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		s.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleSQL reads every session of the database that holds a snapshot
// (backend_xmin), with how long it has held it by the server's clock (see
// the package comment). pg_backend_pid() is the sampler itself.
const sampleSQL = `
SELECT pid, coalesce(application_name, ''), coalesce(usename::text, ''), coalesce(state, ''),
       coalesce(wait_event_type || ':' || wait_event, ''), left(coalesce(query, ''), 200),
       coalesce(xact_start, query_start, backend_start),
       extract(epoch FROM clock_timestamp() - CASE WHEN state = 'active' THEN query_start ELSE coalesce(xact_start, query_start) END)::float8,
       age(backend_xmin)::bigint
FROM pg_stat_activity
WHERE datname = current_database() AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()`

func (s *Sampler) sample(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := s.pool.Query(qctx, sampleSQL)
	if err != nil {
		if ctx.Err() == nil {
			s.failed(err)
		}
		return
	}
	type row struct {
		v     Violation
		idemd bool
	}
	var got []row
	for rows.Next() {
		var (
			r    row
			secs float64
		)
		if err := rows.Scan(&r.v.PID, &r.v.ApplicationName, &r.v.Role, &r.v.State, &r.v.WaitEvent, &r.v.Query, &r.v.XactStart, &secs, &r.v.XminAge); err != nil {
			rows.Close()
			s.failed(err)
			return
		}
		r.v.Held = time.Duration(secs * float64(time.Second))
		r.idemd = s.ours(r.v.ApplicationName, r.v.Role)
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		if ctx.Err() == nil {
			s.failed(err)
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Samples++
	for _, r := range got {
		if r.v.XminAge > s.rep.MaxHorizonAge || s.rep.MaxHorizonAgeHolder == "" {
			s.rep.MaxHorizonAge, s.rep.MaxHorizonAgeHolder = r.v.XminAge, r.v.ApplicationName
		}
		if !r.idemd {
			if r.v.Held > s.rep.LongestOther {
				s.rep.LongestOther, s.rep.LongestOtherHolder = r.v.Held, r.v.ApplicationName
			}
			continue
		}
		if r.v.Held > s.rep.LongestIdemd {
			s.rep.LongestIdemd, s.rep.LongestIdemdHolder = r.v.Held, r.v.ApplicationName
		}
		if r.v.Held <= s.opts.Bound {
			continue
		}
		key := sessionTxn{r.v.PID, r.v.XactStart}
		if i, ok := s.seen[key]; ok {
			if r.v.Held > s.rep.Violations[i].Held {
				s.rep.Violations[i] = r.v
			}
			continue
		}
		s.seen[key] = len(s.rep.Violations)
		s.rep.Violations = append(s.rep.Violations, r.v)
		if s.opts.Logf != nil {
			s.opts.Logf("horizon: %s", r.v)
		}
	}
}

// ours says whether a session is idemd's.
func (s *Sampler) ours(app, role string) bool {
	if s.opts.Ours != nil {
		return s.opts.Ours(app, role)
	}
	return strings.HasPrefix(app, s.opts.ApplicationPrefix) || slices.Contains(s.opts.Roles, role)
}

func (s *Sampler) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Errors++
	s.rep.LastError = err
}

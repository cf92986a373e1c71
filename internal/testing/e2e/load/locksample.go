package load

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The migrations benchmark's view of locks: pg_locks sampled on a
// connection of its own while the migration runs. A lock held for less than
// the interval between two samples may not be seen, and one that is seen
// was held for at most the time between the samples around the ones that
// saw it: the report gives that bound and the interval.

const (
	// migratorAppName and apiAppName are the application_name of the
	// migrator's sessions and of the API's, by which the sampler tells
	// them apart.
	migratorAppName = "idemd-bench-migrate"
	apiAppName      = "idemd-bench-api"
)

// lockSampleSQL lists the relation locks the migrator's sessions hold or
// await in this database (system catalogs and TOAST tables left out: they
// go with every statement and every table lock) and every lock the API's
// sessions await, with whether a migrator's session blocks it and, for a
// lock on no relation, what it is: the API's own NOTIFY takes a lock on
// the database object at commit that every other notifying commit waits
// for. A relation created by the migrator's transaction not yet committed
// has no name or kind the sampler can see.
const lockSampleSQL = `
SELECT a.application_name = $2, l.pid,
       CASE WHEN l.locktype = 'object' AND l.classid = 'pg_database'::regclass AND l.objid = 0
            THEN 'NOTIFY commit lock' ELSE l.locktype END,
       coalesce(l.relation, 0)::bigint, coalesce(c.relname, ''), coalesce(c.relkind::text, ''), l.mode, l.granted,
       a.application_name = $2 AND EXISTS (
           SELECT FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(l.pid)) AND b.application_name = $1)
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_class c ON c.oid = l.relation
WHERE (a.application_name = $1 AND l.locktype = 'relation' AND l.relation >= 16384
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND c.relnamespace IS DISTINCT FROM 'pg_toast'::regnamespace)
   OR (a.application_name = $2 AND NOT l.granted)`

// lockSample is what one sample saw.
type lockSample struct {
	at    time.Time
	locks []sampledLock
}

type sampledLock struct {
	api      bool // an API session's awaited lock; else the migrator's
	pid      int
	locktype string
	relation uint32 // 0: not a relation
	relname  string // "" when the sampler could not see it
	relkind  string // pg_class.relkind, "" when the sampler could not see it
	mode     string
	granted  bool
	behind   bool // an API wait that a migrator's session blocks
}

// lockSampler samples until its context ends.
type lockSampler struct {
	interval time.Duration
	samples  []lockSample
	spent    time.Duration // in the queries, over all samples
}

func (s *lockSampler) run(ctx context.Context, conn *pgx.Conn) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		start := time.Now()
		rows, err := conn.Query(ctx, lockSampleSQL, migratorAppName, apiAppName)
		if err != nil {
			return s.ended(ctx, fmt.Errorf("lock sampler: %w", err))
		}
		sample := lockSample{at: start}
		for rows.Next() {
			var l sampledLock
			var rel int64
			if err := rows.Scan(&l.api, &l.pid, &l.locktype, &rel, &l.relname, &l.relkind, &l.mode, &l.granted, &l.behind); err != nil {
				rows.Close()
				return s.ended(ctx, fmt.Errorf("lock sampler: %w", err))
			}
			l.relation = uint32(rel)
			sample.locks = append(sample.locks, l)
		}
		if err := rows.Err(); err != nil {
			return s.ended(ctx, fmt.Errorf("lock sampler: %w", err))
		}
		s.spent += time.Since(start)
		s.samples = append(s.samples, sample)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ended is nil when the context ended the query: the sampler was stopped.
func (s *lockSampler) ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// longestGap is the longest time between two samples in [from, to].
func (s *lockSampler) longestGap(from, to time.Time) time.Duration {
	var gap time.Duration
	prev := from
	for _, sm := range s.samples {
		if sm.at.Before(from) {
			continue
		}
		if sm.at.After(to) {
			break
		}
		gap = max(gap, sm.at.Sub(prev))
		prev = sm.at
	}
	return max(gap, to.Sub(prev))
}

// LockHeld is a lock the migrator held or awaited during a step.
type LockHeld struct {
	Relation string // "" for relations the step created (not yet visible to other sessions)
	Mode     string
	Granted  bool // false: awaited
	Samples  int  // samples that saw it in the step
	// AtMost bounds the longest time it was seen without a break: the
	// time between the samples around those that saw it, and no longer
	// than the step.
	AtMost time.Duration
}

// APILockWait is the longest wait of an API session for a lock during a
// step.
type APILockWait struct {
	Sessions       int    // API sessions seen waiting
	BehindMigrator int    // of those, the ones a migrator's session blocked
	What           string // the longest one's lock: mode and relation, or lock type
	AtMost         time.Duration
}

// StepLocks is what the sampler saw during one step. Held lists the locks
// on tables, and those on other relations (indexes, sequences) that are
// SHARE UPDATE EXCLUSIVE or stronger: the weaker ones go with a statement
// on their table.
type StepLocks struct {
	Samples   int
	Held      []LockHeld
	NewHeld   int // locks on relations being created (not yet visible), not listed in Held
	APIWaits  APILockWait
	APIWaited bool
}

// lockKey groups what samples saw: the migrator's locks across its
// sessions, the API's waits per session.
type lockKey struct {
	api      bool
	pid      int  // API waits only
	behind   bool // API waits only
	locktype string
	relation uint32
	mode     string
	granted  bool
}

// lockRun is a key seen in consecutive samples first..last.
type lockRun struct {
	key         lockKey
	first, last int
}

// runs lists every key's runs of consecutive samples.
func (s *lockSampler) runs() []lockRun {
	open := map[lockKey]*lockRun{}
	var done []lockRun
	for i, sm := range s.samples {
		seen := map[lockKey]bool{}
		for _, l := range sm.locks {
			k := lockKey{api: l.api, locktype: l.locktype, relation: l.relation, mode: l.mode, granted: l.granted}
			if l.api {
				k.pid, k.behind = l.pid, l.behind
			}
			if seen[k] {
				continue // another migrator session holds the same
			}
			seen[k] = true
			if r, ok := open[k]; ok && r.last == i-1 {
				r.last = i
				continue
			} else if ok {
				done = append(done, *r)
			}
			open[k] = &lockRun{key: k, first: i, last: i}
		}
	}
	for _, r := range open {
		done = append(done, *r)
	}
	return done
}

// bound is the longest a run may have lasted: from the sample before its
// first to the sample after its last (a nominal interval at either end of
// the samples).
func (s *lockSampler) bound(r lockRun) time.Duration {
	from, to := s.samples[r.first].at.Add(-s.interval), s.samples[r.last].at.Add(s.interval)
	if r.first > 0 {
		from = s.samples[r.first-1].at
	}
	if r.last+1 < len(s.samples) {
		to = s.samples[r.last+1].at
	}
	return to.Sub(from)
}

// stepLocks is what the samples saw in [from, to]. names resolves the
// relations the samples could not name.
func (s *lockSampler) stepLocks(from, to time.Time, names map[uint32]string) StepLocks {
	return s.locksWhere(func(at time.Time) bool { return !at.Before(from) && !at.After(to) }, to.Sub(from), names)
}

// outsideLocks is what the samples saw in [from, to] outside every window.
func (s *lockSampler) outsideLocks(from, to time.Time, windows [][2]time.Time, names map[uint32]string) StepLocks {
	return s.locksWhere(func(at time.Time) bool {
		if at.Before(from) || at.After(to) {
			return false
		}
		for _, w := range windows {
			if !at.Before(w[0]) && !at.After(w[1]) {
				return false
			}
		}
		return true
	}, to.Sub(from), names)
}

// locksWhere is what the samples taken when in says saw; no run of
// samples counts for longer than length.
func (s *lockSampler) locksWhere(inTime func(time.Time) bool, length time.Duration, names map[uint32]string) StepLocks {
	var st StepLocks
	in := func(i int) bool { return inTime(s.samples[i].at) }
	for i := range s.samples {
		if in(i) {
			st.Samples++
		}
	}
	kinds := map[uint32]string{} // relations a sample in the step could see
	for i := range s.samples {
		if !in(i) {
			continue
		}
		for _, l := range s.samples[i].locks {
			if l.relkind != "" {
				kinds[l.relation] = l.relkind
			}
		}
	}
	held := map[lockKey]*LockHeld{}
	apiSessions, behind := map[int]bool{}, map[int]bool{}
	for _, r := range s.runs() {
		n := 0
		for i := r.first; i <= r.last; i++ {
			if in(i) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		atMost := min(s.bound(r), length)
		if r.key.api {
			apiSessions[r.key.pid] = true
			what := r.key.mode + " on " + relationName(r.key, names)
			if r.key.behind {
				behind[r.key.pid] = true
				what += ", behind migrate"
			}
			if !st.APIWaited || atMost > st.APIWaits.AtMost {
				st.APIWaited = true
				st.APIWaits.AtMost = atMost
				st.APIWaits.What = what
			}
			continue
		}
		kind, visible := kinds[r.key.relation]
		if !visible {
			st.NewHeld++
			continue
		}
		if !strings.ContainsAny(kind, "rpmf") && modeRank(r.key.mode) < modeRank("ShareUpdateExclusiveLock") {
			continue
		}
		k := r.key
		h, ok := held[k]
		if !ok {
			h = &LockHeld{Relation: names[k.relation], Mode: k.mode, Granted: k.granted}
			held[k] = h
		}
		h.Samples += n
		h.AtMost = max(h.AtMost, atMost)
	}
	st.APIWaits.Sessions, st.APIWaits.BehindMigrator = len(apiSessions), len(behind)
	for _, h := range held {
		st.Held = append(st.Held, *h)
	}
	slices.SortFunc(st.Held, func(a, b LockHeld) int {
		return cmp.Or(cmp.Compare(modeRank(b.Mode), modeRank(a.Mode)), strings.Compare(a.Relation, b.Relation))
	})
	return st
}

// relationName names what an awaited lock is on.
func relationName(k lockKey, names map[uint32]string) string {
	if k.locktype != "relation" {
		return "the " + k.locktype
	}
	if n := names[k.relation]; n != "" {
		return n
	}
	return fmt.Sprintf("relation %d", k.relation)
}

// names maps every relation some sample named to its name.
func (s *lockSampler) names() map[uint32]string {
	m := map[uint32]string{}
	for _, sm := range s.samples {
		for _, l := range sm.locks {
			if l.relname != "" {
				m[l.relation] = l.relname
			}
		}
	}
	return m
}

// resolveNames names, after the migration, the relations no sample could
// name (created by a transaction not committed when sampled).
func (s *lockSampler) resolveNames(ctx context.Context, conn *pgxpool.Pool) (map[uint32]string, error) {
	m := s.names()
	var missing []uint32
	for _, sm := range s.samples {
		for _, l := range sm.locks {
			if l.relation != 0 && m[l.relation] == "" && !slices.Contains(missing, l.relation) {
				missing = append(missing, l.relation)
			}
		}
	}
	if len(missing) == 0 {
		return m, nil
	}
	rows, err := conn.Query(ctx, `SELECT oid::bigint, relname FROM pg_class WHERE oid = ANY($1::oid[])`, missing)
	if err != nil {
		return nil, fmt.Errorf("lock sampler: names: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var oid int64
		var name string
		if err := rows.Scan(&oid, &name); err != nil {
			return nil, fmt.Errorf("lock sampler: names: %w", err)
		}
		m[uint32(oid)] = name
	}
	return m, rows.Err()
}

// modeRank orders PostgreSQL's table lock modes by strength.
func modeRank(mode string) int {
	return slices.Index([]string{"AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock",
		"ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"}, mode)
}

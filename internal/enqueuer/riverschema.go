package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/migrate"
)

// The River schema gate. The move writes river_job in SQL (servermove.go)
// and the Go path through River's client (batch.go); both know one table
// shape, the one River's migrations give it at the versions below. The API
// upgrades River on its own schedule, so the enqueuer reads River's schema
// version (river_migration, line "main") and river_job's columns before it
// moves anything, again every riverSchemaRecheck, and whenever a move finds
// the version changed under it (the move itself compares the version in
// the same statement, so no move writes a table a River migration changed
// after the last check). On any other version or shape it moves nothing:
// the staged rows wait where they are, /readyz fails with the reason, the
// gauge idemd_enqueuer_river_schema_supported is 0, the alert
// IdemdEnqueuerRiverSchemaUnsupported fires, and the reason is logged once
// per change.

// The versions of River's schema the move writes are
// migrate.RiverSchemaVersions: migrate applies River's migrations and
// holds every daemon's schema floor, River's included.

// riverSchemaRecheck is how often a supported schema is read again (an
// unsupported one is read at every batch, the failed passes' backoff
// apart). A River
// migration that changes the version between two reads is caught by the
// move's own comparison; this finds a change that kept the version (a
// column added by hand).
const riverSchemaRecheck = 30 * time.Second

// riverColumn is one column of river_job as the catalog has it.
type riverColumn struct {
	name       string
	typ        string // format_type
	notNull    bool
	hasDefault bool
}

// riverWrites are the columns of river_job the move and River's client
// write, with their types at RiverSchemaVersions. Every other column must
// be nullable or have a default, or an insert that leaves it out fails.
var riverWrites = map[string]string{
	"args":          "jsonb",
	"kind":          "text",
	"max_attempts":  "smallint",
	"metadata":      "jsonb",
	"priority":      "smallint",
	"queue":         "text",
	"scheduled_at":  "timestamp with time zone",
	"state":         "river_job_state",
	"tags":          "character varying(255)[]",
	"unique_key":    "bytea",
	"unique_states": "bit(8)",
}

// riverSchema is what the gate read.
type riverSchema struct {
	// schemas lists the schemas holding a river_job table; found says
	// whether one is on the search path (to_regclass resolves it).
	schemas []string
	found   bool
	// hasLine: river_migration has its line column (River migration 5).
	hasLine bool
	version int // 0 when River is not migrated
	columns []riverColumn
}

// judgeRiverSchema says whether the enqueuer may write river_job, and if
// not, why, in words an operator can act on.
func judgeRiverSchema(s riverSchema, known []int) (ok bool, why string) {
	switch {
	case !s.found && len(s.schemas) > 0:
		return false, fmt.Sprintf("River's tables are in schema %s, which is not on the search path of the enqueuer's role; "+
			"idemd supports River in the schema its role resolves first: install River there, or make it first on the "+
			"search path (ALTER ROLE <role> IN DATABASE <db> SET search_path = %s, public) for idemctl and the daemons alike",
			strings.Join(s.schemas, ", "), s.schemas[0])
	case !s.found:
		return false, "River's tables do not exist: run `idemctl migrate` (it applies River's migrations too)"
	case !s.hasLine || s.version < known[0]:
		return false, fmt.Sprintf("River's schema is at version %d, older than any this enqueuer writes (%s): "+
			"run River's migrations (`idemctl migrate` applies them) before the enqueuer moves jobs", s.version, versionList(known))
	case !slices.Contains(known, s.version):
		return false, fmt.Sprintf("River's schema is at version %d, newer than any this enqueuer was tested with (%s): "+
			"run an idemd release built with that River version; the staged jobs wait in staged_jobs meanwhile", s.version, versionList(known))
	}
	have := make(map[string]riverColumn, len(s.columns))
	for _, c := range s.columns {
		have[c.name] = c
	}
	var drift []string
	for _, name := range sortedKeys(riverWrites) {
		c, ok := have[name]
		switch {
		case !ok:
			drift = append(drift, "column "+name+" is missing")
		case c.typ != riverWrites[name]:
			drift = append(drift, fmt.Sprintf("column %s is %s, not %s", name, c.typ, riverWrites[name]))
		}
	}
	for _, c := range s.columns {
		if _, written := riverWrites[c.name]; !written && c.notNull && !c.hasDefault {
			drift = append(drift, "column "+c.name+" is NOT NULL without a default, so an insert that leaves it out fails")
		}
	}
	if len(drift) > 0 {
		return false, fmt.Sprintf("river_job differs from River's schema version %d: %s; "+
			"the enqueuer writes only the table River's migrations make", s.version, strings.Join(drift, "; "))
	}
	return true, ""
}

func versionList(known []int) string {
	s := make([]string, len(known))
	for i, v := range known {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ", ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// riverSchemaSQL reads where river_job is, whether river_migration has its
// line column, and river_job's columns. The version is read apart
// (riverVersionSQL), only where the line column exists.
const riverSchemaSQL = `
SELECT
    (SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname), '{}')
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE c.relname = 'river_job' AND c.relkind IN ('r', 'p')),
    to_regclass('river_job') IS NOT NULL AND to_regclass('river_migration') IS NOT NULL,
    EXISTS (SELECT FROM pg_catalog.pg_attribute
             WHERE attrelid = to_regclass('river_migration') AND attname = 'line' AND NOT attisdropped),
    (SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}') FROM pg_catalog.pg_attribute a
      WHERE a.attrelid = to_regclass('river_job') AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT coalesce(array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum), '{}') FROM pg_catalog.pg_attribute a
      WHERE a.attrelid = to_regclass('river_job') AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT coalesce(array_agg(a.attnotnull ORDER BY a.attnum), '{}') FROM pg_catalog.pg_attribute a
      WHERE a.attrelid = to_regclass('river_job') AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT coalesce(array_agg(a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' ORDER BY a.attnum), '{}') FROM pg_catalog.pg_attribute a
      WHERE a.attrelid = to_regclass('river_job') AND a.attnum > 0 AND NOT a.attisdropped)`

// riverVersionSQL is the version of River's main migration line, as
// migrate reads it; the move compares it in its own statement (moveSQL's
// gate).
const riverVersionSQL = migrate.RiverVersionSQL

// readRiverSchema reads the gate's inputs.
func readRiverSchema(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (riverSchema, error) {
	var (
		s                   riverSchema
		names, types        []string
		notNull, hasDefault []bool
	)
	if err := q.QueryRow(ctx, riverSchemaSQL).Scan(&s.schemas, &s.found, &s.hasLine, &names, &types, &notNull, &hasDefault); err != nil {
		return s, fmt.Errorf("enqueuer river schema: read river_job: %w", err)
	}
	for i := range names {
		s.columns = append(s.columns, riverColumn{name: names[i], typ: types[i], notNull: notNull[i], hasDefault: hasDefault[i]})
	}
	if s.found && s.hasLine {
		if err := q.QueryRow(ctx, riverVersionSQL).Scan(&s.version); err != nil {
			return s, fmt.Errorf("enqueuer river schema: read river_migration: %w", err)
		}
	}
	return s, nil
}

// errRiverSchema: River's schema is one the enqueuer does not write.
var errRiverSchema = errors.New("river schema not supported")

// riverGate caches the gate's verdict between checks.
type riverGate struct {
	mu        sync.Mutex
	checked   time.Time
	version   int
	ok        bool
	why       string
	lastState string // what was last logged: "" before the first check
}

// blocked is /readyz's view of the gate: why the enqueuer moves nothing,
// or nil.
func (g *riverGate) blocked() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.checked.IsZero() || g.ok {
		return nil
	}
	return fmt.Errorf("%w: %s", errRiverSchema, g.why)
}

// invalidate makes the next batch read the schema again (a move found the
// version changed).
func (g *riverGate) invalidate() {
	g.mu.Lock()
	defer g.mu.Unlock()
	// Read again at the next batch; the verdict stands until then.
	g.checked = time.Time{}
	g.ok, g.why = false, "re-reading River's schema after a move found it changed"
	g.lastState = ""
}

// riverVersion returns the River schema version the next move may write,
// reading the schema when the last read is older than riverSchemaRecheck;
// an error wrapping errRiverSchema when the schema is not one it writes.
func (s *Service) riverVersion(ctx context.Context) (int, error) {
	g := &s.riverGate
	g.mu.Lock()
	defer g.mu.Unlock()
	// Read again when due, and at every batch while the schema is not
	// supported, so moves resume with the first batch after River's is.
	if !g.ok || g.checked.IsZero() || time.Since(g.checked) >= riverSchemaRecheck {
		var rs riverSchema
		err := s.calls.Do(ctx, "enqueuer river schema", func(ctx context.Context) (err error) {
			rs, err = readRiverSchema(ctx, s.pool)
			return err
		})
		if err != nil {
			return 0, err
		}
		if !rs.found && len(rs.schemas) == 0 {
			// Nothing migrated: the move fails on the missing table, and the
			// daemon says to run `idemctl migrate`, as for any of idemd's
			// tables (daemon.SchemaHint), once.
			return 0, nil
		}
		g.ok, g.why = judgeRiverSchema(rs, migrate.RiverSchemaVersions)
		g.version, g.checked = rs.version, time.Now()
		s.metrics.riverSchemaVersion.Set(float64(rs.version))
		if g.ok {
			s.metrics.riverSchemaSupported.Set(1)
		} else {
			s.metrics.riverSchemaSupported.Set(0)
		}
		state := "ok"
		if !g.ok {
			state = g.why
		}
		if state != g.lastState {
			// Once per change: a pass retried every few seconds on an
			// unsupported schema says nothing new.
			if g.ok {
				s.logger.Info("River schema supported: moving staged jobs", zap.Int("river_schema_version", rs.version))
			} else {
				s.logger.Error("River schema not supported: no staged job is moved until it is; they wait in staged_jobs",
					zap.Int("river_schema_version", rs.version), zap.String("reason", g.why))
			}
			g.lastState = state
		}
	}
	if !g.ok {
		return 0, fmt.Errorf("enqueuer batch: %w: %s", errRiverSchema, g.why)
	}
	return g.version, nil
}

// riverLockSQL locks river_job against River's migrations for the rest of
// a Go-path move (ROW EXCLUSIVE: what an insert takes anyway).
const riverLockSQL = `LOCK TABLE river_job IN ROW EXCLUSIVE MODE`

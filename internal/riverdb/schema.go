package riverdb

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// River's schema as idemd writes it. The move writes river_job in SQL
// (MoveSQL) and the enqueuer's Go path through River's client; both know
// one table shape, the one River's migrations give it at the versions
// idemd was tested with (migrate.RiverSchemaVersions). The enqueuer's
// River schema gate reads the schema (ReadSchema) and judges it (Judge)
// before it moves anything.

// VersionSQL reads the version of River's main migration line (0 before
// River's first migration): the schema gate, MoveSQL's own check and
// migrate read it.
const VersionSQL = `SELECT coalesce(max(version), 0) FROM river_migration WHERE line = 'main'`

// LockSQL locks river_job against River's migrations (which lock it
// ACCESS EXCLUSIVE) for the rest of a Go-path move: ROW EXCLUSIVE, what an
// insert takes anyway.
const LockSQL = `LOCK TABLE river_job IN ROW EXCLUSIVE MODE`

// Column is one column of river_job as the catalog has it.
type Column struct {
	Name       string
	Type       string // format_type
	NotNull    bool
	HasDefault bool
}

// Writes are the columns of river_job the move and River's client
// write, with their types at migrate.RiverSchemaVersions. Every other column must
// be nullable or have a default, or an insert that leaves it out fails.
var Writes = map[string]string{
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

// Schema is what the gate read.
type Schema struct {
	// Schemas lists the schemas holding a river_job table; Found says
	// whether one is on the search path (to_regclass resolves it).
	Schemas []string
	Found   bool
	// HasLine: river_migration has its line column (River migration 5).
	HasLine bool
	Version int // 0 when River is not migrated
	Columns []Column
}

// Judge says whether the enqueuer may write river_job, and if
// not, why, in words an operator can act on.
func Judge(s Schema, known []int) (ok bool, why string) {
	switch {
	case !s.Found && len(s.Schemas) > 0:
		return false, fmt.Sprintf("River's tables are in schema %s, which is not on the search path of the enqueuer's role; "+
			"idemd supports River in the schema its role resolves first: install River there, or make it first on the "+
			"search path (ALTER ROLE <role> IN DATABASE <db> SET search_path = %s, public) for idemctl and the daemons alike",
			strings.Join(s.Schemas, ", "), s.Schemas[0])
	case !s.Found:
		return false, "River's tables do not exist: run `idemctl migrate` (it applies River's migrations too)"
	case !s.HasLine || s.Version < known[0]:
		return false, fmt.Sprintf("River's schema is at version %d, older than any this enqueuer writes (%s): "+
			"run River's migrations (`idemctl migrate` applies them) before the enqueuer moves jobs", s.Version, versionList(known))
	case !slices.Contains(known, s.Version):
		return false, fmt.Sprintf("River's schema is at version %d, newer than any this enqueuer was tested with (%s): "+
			"run an idemd release built with that River version; the staged jobs wait in staged_jobs meanwhile", s.Version, versionList(known))
	}
	have := make(map[string]Column, len(s.Columns))
	for _, c := range s.Columns {
		have[c.Name] = c
	}
	var drift []string
	for _, name := range sortedKeys(Writes) {
		c, ok := have[name]
		switch {
		case !ok:
			drift = append(drift, "column "+name+" is missing")
		case c.Type != Writes[name]:
			drift = append(drift, fmt.Sprintf("column %s is %s, not %s", name, c.Type, Writes[name]))
		}
	}
	for _, c := range s.Columns {
		if _, written := Writes[c.Name]; !written && c.NotNull && !c.HasDefault {
			drift = append(drift, "column "+c.Name+" is NOT NULL without a default, so an insert that leaves it out fails")
		}
	}
	if len(drift) > 0 {
		return false, fmt.Sprintf("river_job differs from River's schema version %d: %s; "+
			"the enqueuer writes only the table River's migrations make", s.Version, strings.Join(drift, "; "))
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

// SchemaSQL reads where river_job is, whether river_migration has its
// line column, and river_job's columns. The version is read apart
// (VersionSQL), only where the line column exists.
const SchemaSQL = `
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

// ReadSchema reads the gate's inputs.
func ReadSchema(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (Schema, error) {
	var (
		s                   Schema
		names, types        []string
		notNull, hasDefault []bool
	)
	if err := q.QueryRow(ctx, SchemaSQL).Scan(&s.Schemas, &s.Found, &s.HasLine, &names, &types, &notNull, &hasDefault); err != nil {
		return s, fmt.Errorf("river schema: read river_job: %w", err)
	}
	for i := range names {
		s.Columns = append(s.Columns, Column{Name: names[i], Type: types[i], NotNull: notNull[i], HasDefault: hasDefault[i]})
	}
	if s.Found && s.HasLine {
		if err := q.QueryRow(ctx, VersionSQL).Scan(&s.Version); err != nil {
			return s, fmt.Errorf("river schema: read river_migration: %w", err)
		}
	}
	return s, nil
}

// River's migration table, as migrate reads it before it runs River's
// migrations (internal/migrate/riverowner.go says why).

// ActsAsOwnerExpr is a boolean SQL expression: the running role may act
// as the owner of River's tables on the search path (false when River is
// not installed). migrate's owner check reads it too.
const ActsAsOwnerExpr = `coalesce((SELECT pg_catalog.pg_has_role(current_user, relowner, 'USAGE') FROM pg_catalog.pg_class WHERE oid = to_regclass('river_migration')), false)`

// MigrationTablesSQL reads whether river_migration resolves on the search
// path, whether the running role may act as its owner, the owner, the
// schemas holding one, and -2 when the role may read River's version
// (VersionSQL then reads it) or -1 when not.
const MigrationTablesSQL = `
SELECT to_regclass('river_migration') IS NOT NULL,
    ` + ActsAsOwnerExpr + `,
    coalesce((SELECT relowner::regrole::text FROM pg_catalog.pg_class WHERE oid = to_regclass('river_migration')), ''),
    (SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname), '{}')
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE c.relname = 'river_migration' AND c.relkind IN ('r', 'p')),
    CASE WHEN has_table_privilege(to_regclass('river_migration'), 'SELECT')
         THEN -2 ELSE -1 END`

// VersionReadableSQL: River is not installed, or the role may read its
// version.
const VersionReadableSQL = `SELECT to_regclass('river_migration') IS NULL
    OR has_table_privilege(to_regclass('river_migration'), 'SELECT')`

// GINPendingSQL lists River's GIN indexes on river_job that keep a
// pending list (fastupdate on).
const GINPendingSQL = `
SELECT c.oid::regclass::text
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
WHERE i.indrelid = to_regclass('river_job') AND a.amname = 'gin'
  AND NOT coalesce(c.reloptions @> ARRAY['fastupdate=off'], false)
  AND pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE')`

// MigrationInsert is the row River's migrator records for version v:
// without the line column before migration 005 added it.
func MigrationInsert(v int) string {
	if v < 5 {
		return fmt.Sprintf("INSERT INTO river_migration (version) VALUES (%d)", v)
	}
	return fmt.Sprintf("INSERT INTO river_migration (line, version) VALUES ('main', %d)", v)
}
